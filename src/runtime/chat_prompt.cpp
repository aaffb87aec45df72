#include "runtime/chat_prompt.h"

namespace dsv4::runtime {

expected<ChatPrompt, RuntimeError> prepare_chat_prompt(ChatPromptInput in, const Tokenizer& tok) {
  ChatPrompt p;
  if (in.tool_memory) {
    recover_tool_calls(in.messages, *in.tool_memory, in.find_tool_calls);
    p.replayed_messages = apply_exact_replay(in.messages, *in.tool_memory);
  }
  // The renderer drops earlier reasoning exactly when thinking without any tools (render_official.h).
  bool any_tools = !in.render.tools.empty();
  for (const auto& m : in.messages) any_tools = any_tools || !m.tools.empty();
  p.hidden_reasoning = in.render.thinking_mode == ThinkingMode::THINKING && in.render.drop_thinking && !any_tools;
  auto rendered = render_official(in.messages, in.render);
  if (!rendered) return unexpected(runtime_error(RuntimeErrorKind::INVALID_REQUEST, rendered.error()));
  const bool check = in.ctx > 0;
  if (check) {
    size_t bytes = 0;
    for (const auto& piece : *rendered) bytes += piece.text.size();
    if (bytes / tok.max_token_bytes() >= in.ctx) return unexpected(context_length_error(in.ctx, "messages", 0));
  }
  auto tokens = tok.encode_prompt(*rendered, check ? in.ctx : SIZE_MAX);
  if (!tokens)
    return unexpected(
        RuntimeError{RuntimeErrorKind::INTERNAL, "tokenizing the prompt failed: " + tokens.error().message, ""});
  if (check && tokens->size() >= in.ctx)
    return unexpected(context_length_error(in.ctx, "messages", tokens->size() > in.ctx ? 0 : tokens->size()));
  p.tokens = std::move(*tokens);
  p.rendered = std::move(*rendered);
  return p;
}

}  // namespace dsv4::runtime
