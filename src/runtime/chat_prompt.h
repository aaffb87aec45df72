// A chat request's messages -> the prompt a Job runs: tool calls the model
// made earlier are rendered as it sampled them (tool_memory.h: recovered from
// the disk cache after a restart, then exact replay), the conversation is
// rendered with the official encoder (formats.md §4) and tokenized.
//
// Context check (when `ctx` > 0): a prompt that cannot fit is refused
// cheaply, by its length in bytes when no tokenisation could fit it
// (bytes / Tokenizer::max_token_bytes() >= ctx), else by tokenising only
// until it passes the context (encode_prompt's stop_after); the error is
// CONTEXT_LENGTH on field "messages". A prompt of exactly `ctx` tokens is
// refused too: the reply needs at least one token of room.
//
// Thread-safe (the tokenizer is immutable, the tool memory locks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "chat/chat_message.h"
#include "chat/render_official.h"
#include "runtime/runtime_error.h"
#include "runtime/tool_memory.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::runtime {

struct ChatPromptInput {
  std::vector<ChatMessage> messages;
  RenderOptions render;
  uint32_t ctx = 0;                   // the session's context; 0: count only, no check
  ToolMemory* tool_memory = nullptr;  // exact replay of remembered tool calls (nullptr: none)
  ToolCallFinder find_tool_calls;     // ids the memory does not know -> DSML from the disk cache (optional)
};

struct ChatPrompt {
  std::vector<int32_t> tokens;  // canonical prompt tokens
  RenderedPrompt rendered;      // the rendered text (session reuse works on it)
  // Thinking mode without tools: the renderer drops earlier reasoning, so the
  // session is keyed by the client-visible transcript (JobInput::hidden_reasoning).
  bool hidden_reasoning = false;
  size_t replayed_messages = 0;  // assistant turns rendered from the tool-call memory
};

expected<ChatPrompt, RuntimeError> prepare_chat_prompt(ChatPromptInput in, const Tokenizer& tok);

}  // namespace dsv4::runtime
