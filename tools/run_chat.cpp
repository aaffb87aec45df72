#include "run_chat.h"

#include "chat/render_official.h"
#include "conversation/conversation_file.h"
#include "conversation/message_json.h"
#include "run_interrupt.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::tools {

namespace {

// A string for the options line: quoted, control characters escaped, long
// texts shortened.
std::string quoted(const std::string& s, size_t max_chars = 40) {
  std::string out = "\"";
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i, ++n) {
    if (n == max_chars) {
      out += "...";
      break;
    }
    const char c = s[i];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"' || c == '\\') out += std::string("\\") + c;
    else if (static_cast<unsigned char>(c) < 0x20) out += strfmt("\\x%02x", static_cast<unsigned char>(c));
    else out += c;
  }
  return utf8_lossy(out + "\"");
}

}  // namespace

std::string RunSettings::describe() const {
  std::string stops = "[";
  for (size_t i = 0; i < stop.size(); ++i) stops += (i ? "," : "") + quoted(stop[i]);
  stops += "]";
  return strfmt(
      "thinking=%s (%s) system=%s temp=%g top_p=%g top_k=%d min_p=%g repeat_penalty=%g presence_penalty=%g "
      "frequency_penalty=%g seed=%llu max_tokens=%s stop=%s ignore_eos=%s%s",
      thinking_level_name(thinking), thinking_level_flag(thinking), system.empty() ? "none" : quoted(system).c_str(),
      static_cast<double>(sampling.temperature), static_cast<double>(sampling.top_p), sampling.top_k,
      static_cast<double>(sampling.min_p), static_cast<double>(sampling.repetition_penalty),
      static_cast<double>(sampling.presence_penalty), static_cast<double>(sampling.frequency_penalty),
      static_cast<unsigned long long>(sampling.seed),
      max_tokens > 0 ? std::to_string(max_tokens).c_str() : "unlimited", stops.c_str(), ignore_eos ? "yes" : "no",
      dump_logprobs.empty() ? "" : strfmt(" dump_logprobs=%s (top %d)", dump_logprobs.c_str(), logprobs_top_k).c_str());
}

ChatSession::ChatSession(Engine& engine, std::unique_ptr<Session> session, const RunSettings& settings)
    : engine_(&engine), session_(std::move(session)), settings_(&settings), thinking_(settings.thinking) {
  if (!settings.system.empty()) {
    ChatMessage sys;
    sys.role = ChatRole::SYSTEM;
    sys.content = ChatContent::from_text(settings.system);
    messages_.push_back(std::move(sys));
  }
}

expected<GenerateResult> ChatSession::reply(const std::string& user_text, ReplyPrinter& printer) {
  ChatMessage user;
  user.role = ChatRole::USER;
  user.content = ChatContent::from_text(user_text);
  std::vector<ChatMessage> conversation = messages_;
  conversation.push_back(user);
  DSV4_TRY_ASSIGN(const RenderedPrompt rendered, render_official(conversation, render_options_for(thinking_)));
  const Tokenizer& tok = engine_->tokenizer();
  DSV4_TRY_ASSIGN(const std::vector<int32_t> prompt, tok.encode_prompt(rendered));

  GenerateOptions o;
  o.sampling = settings_->sampling;
  // A different (but reproducible) random stream for every turn.
  o.sampling.seed = settings_->sampling.seed + turns_;
  o.max_tokens = settings_->max_tokens;
  o.stop = settings_->stop;
  o.parse_chat = true;
  o.thinking = parse_mode_for(thinking_);
  o.logprobs = settings_->dump_logprobs.empty() ? -1 : settings_->logprobs_top_k;
  o.ignore_eos = settings_->ignore_eos;

  PrefillProgress progress;
  GenerateCallbacks cb;
  cb.on_event = [&](const DsmlEvent& e) {
    progress.finish();
    printer.on_event(e);
  };
  cb.on_prefill_progress = [&](uint64_t done, uint64_t total) { progress.update(done, total); };
  cb.cancelled = [] { return interrupt_pending(); };

  interrupt_clear();
  interrupt_set_generating(true);
  auto r = generate(*session_, tok, prompt, o, cb);
  interrupt_set_generating(false);
  progress.finish();
  printer.finish();
  ++turns_;
  if (!r) return r.error();
  if (r->finish != FinishReason::CANCELLED) {
    messages_.push_back(std::move(user));
    messages_.push_back(assistant_message_from(r->message));
  }
  return r;
}

void ChatSession::reset() {
  if (!messages_.empty() && messages_.front().role == ChatRole::SYSTEM)
    messages_.resize(1);
  else
    messages_.clear();
  session_->reset();
}

Status ChatSession::save(const std::string& path) const {
  SavedConversation c;
  c.thinking = thinking_;
  c.messages = messages_;
  c.model_name = engine_->info().model_name;
  c.model_path = engine_->info().model_path;
  c.n_vocab = engine_->info().n_vocab;
  c.session = session_->save();
  return conversation_save_file(path, c);
}

expected<LoadReport> ChatSession::load(const std::string& path) {
  DSV4_TRY_ASSIGN(SavedConversation c, conversation_load_file(path));
  LoadReport rep;
  rep.messages = c.messages.size();
  messages_ = std::move(c.messages);
  thinking_ = c.thinking;
  if (c.session.empty()) {
    session_->reset();
    rep.state_note = "the file holds no session state";
  } else if (auto st = session_->load(c.session); !st) {
    // A failed load may have written part of the state: start clean.
    session_->reset();
    rep.state_note = st.error().message;
    if (c.n_vocab != engine_->info().n_vocab || c.model_name != engine_->info().model_name)
      rep.state_note += strfmt(" (saved with %s, %u tokens of vocabulary)", c.model_name.c_str(), c.n_vocab);
  } else {
    rep.state_restored = true;
  }
  return rep;
}

}  // namespace dsv4::tools
