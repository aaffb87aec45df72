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
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '"' || c == '\\')
      out += std::string("\\") + c;
    else if (static_cast<unsigned char>(c) < 0x20)
      out += strfmt("\\x%02x", static_cast<unsigned char>(c));
    else
      out += c;
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
             thinking_level_name(thinking), thinking_level_flag(thinking),
             system.empty() ? "none" : quoted(system).c_str(), static_cast<double>(sampling.temperature),
             static_cast<double>(sampling.top_p), sampling.top_k, static_cast<double>(sampling.min_p),
             static_cast<double>(sampling.repetition_penalty), static_cast<double>(sampling.presence_penalty),
             static_cast<double>(sampling.frequency_penalty), static_cast<unsigned long long>(sampling.seed),
             max_tokens > 0 ? std::to_string(max_tokens).c_str() : "unlimited", stops.c_str(),
             ignore_eos ? "yes" : "no",
             dump_logprobs.empty()
                 ? ""
                 : strfmt(" dump_logprobs=%s (top %d)", dump_logprobs.c_str(), logprobs_top_k).c_str()) +
         (thinking_budget >= 0 ? strfmt(" thinking_budget=%d", thinking_budget) : std::string()) +
         (raw_prompt ? std::string(" raw_prompt=yes") : std::string()) +
         (cache.disk_dir.empty() ? std::string() : " " + cache.describe());
}

ChatSession::ChatSession(runtime::Runtime& runtime, runtime::EngineBackend& backend, const RunSettings& settings)
    : runtime_(&runtime), backend_(&backend), settings_(&settings), thinking_(settings.thinking) {
  if (!settings.system.empty()) {
    ChatMessage sys;
    sys.role = ChatRole::SYSTEM;
    sys.content = ChatContent::from_text(settings.system);
    messages_.push_back(std::move(sys));
  }
}

size_t ChatSession::session_tokens() {
  size_t n = 0;
  runtime_->with_backend([&](runtime::Backend&) { n = backend_->current_tokens(); });
  return n;
}

expected<GenerateResult> ChatSession::reply(const std::string& user_text, ReplyPrinter& printer) {
  ChatMessage user;
  user.role = ChatRole::USER;
  user.content = ChatContent::from_text(user_text);
  runtime::JobInput in;
  if (settings_->raw_prompt) {
    // The text as the model's input, special tokens spelled in it included (as /v1/completions reads a prompt).
    in.prompt = runtime_->tokenizer().encode_with_specials(user_text, runtime_->context_size());
    if (in.prompt.empty()) return make_error("--raw-prompt: the prompt is empty");
  } else {
    std::vector<ChatMessage> conversation = messages_;
    conversation.push_back(user);
    // No context check here: the job reports a prompt that does not fit, with its length.
    auto prompt = runtime_->prepare(std::move(conversation), render_options_for(thinking_), /*check_context=*/false);
    if (!prompt) return make_error("%s", prompt.error().message.c_str());
    in.prompt = std::move(prompt->tokens);
    in.rendered = std::move(prompt->rendered);
    in.hidden_reasoning = prompt->hidden_reasoning;
  }
  GenerateOptions& o = in.options;
  o.sampling = settings_->sampling;
  // A different (but reproducible) random stream for every turn.
  o.sampling.seed = settings_->sampling.seed + turns_;
  o.max_tokens = settings_->max_tokens;
  o.stop = settings_->stop;
  o.parse_chat = !settings_->raw_prompt;  // raw: plain text, no DSML/thinking parsing
  o.thinking = parse_mode_for(thinking_);
  o.logprobs = settings_->dump_logprobs.empty() ? -1 : settings_->logprobs_top_k;
  o.ignore_eos = settings_->ignore_eos;
  if (thinking_ != ThinkingLevel::NONE) in.thinking_budget = settings_->thinking_budget;

  auto job = std::make_shared<runtime::Job>(std::move(in));
  job->set_client_check([] { return interrupt_pending(); });  // Ctrl-C
  PrefillProgress progress;
  interrupt_clear();
  interrupt_set_generating(true);
  const runtime::JobOutcome outcome = runtime_->run(
      job,
      [&](const DsmlEvent& e) {
        progress.finish();
        printer.on_event(e);
      },
      [&](uint64_t done, uint64_t total) { progress.update(done, total); });
  interrupt_set_generating(false);
  job->clear_client_check();
  progress.finish();
  printer.finish();
  ++turns_;
  if (outcome.error) return make_error("%s", outcome.error->message.c_str());
  GenerateResult r = outcome.result;
  if (r.finish != FinishReason::CANCELLED && !settings_->raw_prompt) {
    messages_.push_back(std::move(user));
    messages_.push_back(assistant_message_from(r.message));
  }
  return r;
}

void ChatSession::reset() {
  if (!messages_.empty() && messages_.front().role == ChatRole::SYSTEM)
    messages_.resize(1);
  else
    messages_.clear();
  runtime_->with_backend([&](runtime::Backend&) { backend_->reset_current(); });
}

Status ChatSession::save(const std::string& path) {
  SavedConversation c;
  c.thinking = thinking_;
  c.messages = messages_;
  const EngineInfo& info = engine().info();
  c.model_name = info.model_name;
  c.model_path = info.model_path;
  c.n_vocab = info.n_vocab;
  runtime_->with_backend([&](runtime::Backend&) { c.session = backend_->save_current(); });
  return conversation_save_file(path, c);
}

expected<LoadReport> ChatSession::load(const std::string& path) {
  DSV4_TRY_ASSIGN(SavedConversation c, conversation_load_file(path));
  LoadReport rep;
  rep.messages = c.messages.size();
  messages_ = std::move(c.messages);
  thinking_ = c.thinking;
  if (c.session.empty()) {
    runtime_->with_backend([&](runtime::Backend&) { backend_->reset_current(); });
    rep.state_note = "the file holds no session state";
    return rep;
  }
  Status st;
  runtime_->with_backend([&](runtime::Backend&) { st = backend_->load_current(c.session); });
  if (!st) {
    rep.state_note = st.error().message;
    const EngineInfo& info = engine().info();
    if (c.n_vocab != info.n_vocab || c.model_name != info.model_name)
      rep.state_note += strfmt(" (saved with %s, %u tokens of vocabulary)", c.model_name.c_str(), c.n_vocab);
  } else {
    rep.state_restored = true;
  }
  return rep;
}

}  // namespace dsv4::tools
