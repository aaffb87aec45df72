#include "server/openai_completions.h"

#include <cmath>

#include "chat/json_limits.h"
#include "server/json_util.h"
#include "server/openai_common.h"
#include "server/sse.h"
#include "tokenizer/stream_decoder.h"

namespace dsv4::server {

namespace {

struct CompletionRequest {
  ChatRequest sampling;  // model, sampling knobs, max_tokens, stop, stream
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool ids_given = false;
  bool echo = false;
  int logprobs = -1;
};

expected<CompletionRequest> parse(const ordered_json& body) {
  // A body from parse_json_text is within the limit already; this guards one built otherwise, before anything
  // below copies or walks it (nlohmann's copy, == and dump() recurse once per level; json_limits.h).
  DSV4_TRY(check_json_depth(body));
  if (!body.is_object()) return make_error("the request body must be a JSON object");
  JsonFields f(body);
  CompletionRequest c;
  DSV4_TRY_ASSIGN(auto model, f.string("model"));
  c.sampling.model = model.value_or("");
  const ordered_json* prompt = f.get("prompt");
  if (!prompt) return make_error("'prompt' is required");
  const ordered_json* p = prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    c.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    c.ids_given = true;
    for (const auto& v : *p) {
      if (!v.is_number_integer()) return make_error("'prompt' token ids must be integers");
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id > INT32_MAX)
        return make_error("'prompt' holds the invalid token id %lld", static_cast<long long>(id));
      c.prompt_ids.push_back(static_cast<int32_t>(id));
    }
  } else if (p->is_array() && p->size() > 1) {
    return make_error("'prompt' holds several prompts; this server completes one prompt per request");
  } else {
    return make_error("'prompt' must be a string, an array with one string, or an array of token ids");
  }
  DSV4_TRY(read_openai_sampling(body, c.sampling));
  if (!c.sampling.max_tokens) c.sampling.max_tokens = 16;  // OpenAI's default
  DSV4_TRY_ASSIGN(auto stream, f.boolean("stream"));
  c.sampling.stream = stream.value_or(false);
  DSV4_TRY_ASSIGN(const ordered_json* so, f.object("stream_options"));
  if (so) {
    DSV4_TRY_ASSIGN(auto iu, JsonFields(*so, "stream_options").boolean("include_usage"));
    c.sampling.include_usage = iu.value_or(false);
  }
  DSV4_TRY_ASSIGN(auto logprobs, f.integer("logprobs", 0, 5));
  if (logprobs) c.logprobs = static_cast<int>(*logprobs);
  DSV4_TRY_ASSIGN(auto echo, f.boolean("echo"));
  c.echo = echo.value_or(false);
  DSV4_TRY_ASSIGN(auto suffix, f.string("suffix"));
  if (suffix && !suffix->empty()) return make_error("'suffix' is not supported");
  DSV4_TRY_ASSIGN(auto best_of, f.integer("best_of", 1, INT32_MAX));
  if (best_of && *best_of > 1) return make_error("best_of > 1 is not supported");
  return c;
}

ordered_json legacy_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok, size_t text_offset) {
  ordered_json tokens = ordered_json::array(), token_lps = ordered_json::array(), tops = ordered_json::array(),
               offsets = ordered_json::array();
  size_t at = text_offset;
  for (const auto& lp : lps) {
    const std::string text = utf8_lossy(lp.text);
    tokens.push_back(text);
    token_lps.push_back(std::isfinite(lp.logprob) ? static_cast<double>(lp.logprob) : -9999.0);
    ordered_json top = ordered_json::object();
    for (const auto& [id, l] : lp.top)
      top[utf8_lossy(tok.token_bytes(id))] = std::isfinite(l) ? static_cast<double>(l) : -9999.0;
    tops.push_back(std::move(top));
    offsets.push_back(at);
    at += lp.text.size();
  }
  return ordered_json{{"tokens", std::move(tokens)},
                      {"token_logprobs", std::move(token_lps)},
                      {"top_logprobs", std::move(tops)},
                      {"text_offset", std::move(offsets)}};
}

class CompletionsWriter final : public ReplyWriter {
 public:
  CompletionsWriter(std::string model, bool include_usage, bool logprobs, std::string echo, const Tokenizer& tok)
      : id_("cmpl-" + random_hex(12)),
        created_(unix_time()),
        model_(std::move(model)),
        include_usage_(include_usage),
        logprobs_(logprobs),
        echo_(std::move(echo)),
        tok_(tok) {}

  std::string stream_begin() override { return echo_.empty() ? std::string() : sse_data(chunk(echo_, nullptr)); }

  std::string stream_events(const std::vector<OutEvent>& events) override {
    std::string text;
    for (const auto& e : events)
      if (e.kind == OutKind::CONTENT) text += e.text;
    return text.empty() ? std::string() : sse_data(chunk(text, nullptr));
  }

  std::string stream_end(const FinalReply& r) override {
    ordered_json last = chunk("", openai_finish_reason(r.finish));
    if (logprobs_) last["choices"][0]["logprobs"] = legacy_logprobs(r.logprobs, tok_, echo_.size());
    std::string out = sse_data(last);
    if (include_usage_) {
      ordered_json u = base();
      u["choices"] = ordered_json::array();
      u["usage"] = openai_usage_json(r);
      out += sse_data(u);
    }
    return out + sse_done();
  }

  std::string stream_error(const ApiError& e) override {
    return sse_data(error_json(e, ErrorShape::OPENAI)) + sse_done();
  }
  std::string stream_keepalive() override { return sse_comment("keepalive"); }

  ordered_json body(const FinalReply& r) override {
    ordered_json choice = ordered_json::object();
    choice["text"] = echo_ + r.content;
    choice["index"] = 0;
    choice["logprobs"] = logprobs_ ? legacy_logprobs(r.logprobs, tok_, echo_.size()) : ordered_json(nullptr);
    choice["finish_reason"] = openai_finish_reason(r.finish);
    ordered_json j = base();
    j["choices"] = ordered_json::array({std::move(choice)});
    j["usage"] = openai_usage_json(r);
    return j;
  }

 private:
  ordered_json base() const {
    ordered_json j = ordered_json::object();
    j["id"] = id_;
    j["object"] = "text_completion";
    j["created"] = created_;
    j["model"] = model_;
    j["system_fingerprint"] = "dsv4";
    return j;
  }

  ordered_json chunk(const std::string& text, const char* finish) const {
    ordered_json choice{{"text", text},
                        {"index", 0},
                        {"logprobs", nullptr},
                        {"finish_reason", finish ? ordered_json(finish) : ordered_json(nullptr)}};
    ordered_json j = base();
    j["choices"] = ordered_json::array({std::move(choice)});
    if (include_usage_) j["usage"] = nullptr;
    return j;
  }

  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const bool include_usage_, logprobs_;
  const std::string echo_;
  const Tokenizer& tok_;
};

}  // namespace

expected<PreparedRequest, ApiError> prepare_openai_completions(const ordered_json& body, const ServeContext& ctx) {
  auto req = parse(body);
  if (!req) return unexpected(invalid_request(req.error()));
  auto alias = resolve_model(ctx.models, req->sampling.model);
  if (!alias) return unexpected(alias.error());
  std::vector<int32_t> tokens;
  std::string prompt_text;
  if (req->ids_given) {
    for (int32_t id : req->prompt_ids)
      if (static_cast<size_t>(id) >= ctx.tok.n_vocab())
        return unexpected(invalid_request(
            strfmt("'prompt' holds the token id %d, outside the vocabulary of %zu tokens", id, ctx.tok.n_vocab()),
            "prompt"));
    tokens = req->prompt_ids;
    prompt_text = utf8_lossy(ctx.tok.decode(tokens));
  } else {
    // Refused cheaply when it cannot fit (chat_request.cpp does the same).
    if (req->prompt_text.size() / ctx.tok.max_token_bytes() >= ctx.ctx)
      return unexpected(context_length_error(ctx.ctx, "prompt", 0));
    tokens = ctx.tok.encode_with_specials(req->prompt_text, ctx.ctx);
    prompt_text = req->prompt_text;
  }
  if (tokens.empty()) return unexpected(invalid_request("'prompt' must not be empty", "prompt"));
  if (tokens.size() >= ctx.ctx)
    return unexpected(context_length_error(ctx.ctx, "prompt", tokens.size() > ctx.ctx ? 0 : tokens.size()));
  PreparedRequest p;
  GenerateOptions& o = p.job.options;
  o.sampling = resolve_sampling(req->sampling, ThinkingLevel::NONE);
  o.max_tokens = req->sampling.max_tokens.value_or(16);
  o.ignore_eos = req->sampling.ignore_eos;
  o.stop = req->sampling.stop;
  o.parse_chat = false;
  o.thinking = ThinkingMode::CHAT;
  o.logprobs = req->logprobs;
  p.job.prompt = std::move(tokens);
  p.stream = req->sampling.stream;
  p.n = req->sampling.n;
  p.policy = ReplyAssembler::Policy{"call_", false, true};
  p.prompt_tokens = p.job.prompt.size();
  const std::string model = req->sampling.model.empty() ? ctx.models.served_id : req->sampling.model;
  p.writer = std::make_unique<CompletionsWriter>(model, req->sampling.include_usage, req->logprobs >= 0,
                                                 req->echo ? prompt_text : std::string(), ctx.tok);
  return p;
}

}  // namespace dsv4::server
