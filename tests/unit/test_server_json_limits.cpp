// The nesting limit of request JSON (chat/json_limits.h): parse_json_text
// refuses text nesting deeper than k_max_json_depth, the dialect adapters
// refuse such values however they were built, and nothing that walks request
// or model JSON recurses without that bound. Every deep case below reaches
// the code that walked it recursively (a copy, py_json_dumps, dump(), ==),
// which overflowed the stack at 100,000 levels; over HTTP the server answers
// 400 and keeps serving. Also: the integer-field range message, and the usage
// of replies with a forced tool call.
#include <gtest/gtest.h>
#include <httplib.h>

#include <optional>
#include <thread>

#include "chat/dsml_parser.h"
#include "chat/json_limits.h"
#include "chat/py_json.h"
#include "server/anthropic_messages.h"
#include "server/http_server.h"
#include "runtime/job_runner.h"
#include "server/json_util.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"
#include "server_test_util.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;
using namespace dsv4::server::test;

namespace {

constexpr size_t k_deep = 100000;
constexpr std::string_view k_too_deep = "nests deeper than 128 levels (the server's limit)";

// `depth` nested arrays ("[[1]]" for 2) or objects ({"a": {"a": 1}} for 2) around the scalar 1.
std::string deep_text(size_t depth, bool objects) {
  std::string out;
  out.reserve(depth * 7 + 1);
  for (size_t i = 0; i < depth; ++i) out += objects ? "{\"a\": " : "[";
  out += '1';
  out.append(depth, objects ? '}' : ']');
  return out;
}

// The same value, built without parsing (and without recursion: nlohmann copies recursively).
ordered_json deep_value(size_t depth, bool objects) {
  ordered_json root = objects ? ordered_json::object() : ordered_json::array();
  ordered_json* cur = &root;
  for (size_t i = 1; i < depth; ++i) {
    if (objects) {
      (*cur)["a"] = ordered_json::object();
      cur = &(*cur)["a"];
    } else {
      cur->push_back(ordered_json::array());
      cur = &cur->back();
    }
  }
  if (objects)
    (*cur)["a"] = 1;
  else
    cur->push_back(1);
  return root;
}

// Nesting depth of a (shallow) value, by the rule of json_limits.h.
size_t depth_of(const ordered_json& v) {
  if (!v.is_structured()) return 0;
  size_t d = 0;
  for (const auto& m : v) d = std::max(d, depth_of(m));
  return d + 1;
}

// Containers open at the first '@' of a template (outside strings).
size_t depth_at_placeholder(std::string_view tmpl) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < tmpl.size() && tmpl[i] != '@'; ++i) {
    const char c = tmpl[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return depth;
}

std::string replace_placeholder(std::string tmpl, const std::string& with) {
  const size_t at = tmpl.find('@');
  EXPECT_NE(at, std::string::npos);
  return tmpl.replace(at, 1, with);
}

enum class Route { CHAT, RESPONSES, MESSAGES, COUNT_TOKENS, COMPLETIONS };

const char* route_name(Route r) {
  switch (r) {
    case Route::CHAT: return "chat";
    case Route::RESPONSES: return "responses";
    case Route::MESSAGES: return "messages";
    case Route::COUNT_TOKENS: return "count_tokens";
    case Route::COMPLETIONS: return "completions";
  }
  return "";
}

struct Ctx {
  std::unique_ptr<Tokenizer> tok = make_tokenizer();
  ToolMemory memory;
  ServeContext ctx{*tok, 1 << 16, ModelCatalog{"tiny", {}}, memory};
};

// The adapter's error for a parsed body (nullopt: the request was prepared).
std::optional<ApiError> adapter_error(Route route, const ordered_json& body, const ServeContext& ctx) {
  auto error_of = [](auto r) -> std::optional<ApiError> {
    if (r) return std::nullopt;
    return r.error();
  };
  switch (route) {
    case Route::CHAT: return error_of(prepare_openai_chat(body, ctx));
    case Route::RESPONSES: return error_of(prepare_openai_responses(body, ctx));
    case Route::MESSAGES: return error_of(prepare_anthropic_messages(body, ctx));
    case Route::COUNT_TOKENS: return error_of(anthropic_count_tokens(body, ctx));
    case Route::COMPLETIONS: return error_of(prepare_openai_completions(body, ctx));
  }
  return std::nullopt;
}

// What an HTTP route does with a body: parse_json_text (its error is a 400
// invalid_request with the parse error's message), then the adapter.
std::optional<ApiError> route_error(Route route, const std::string& text, const ServeContext& ctx) {
  auto body = parse_json_text(text);
  if (!body) return invalid_request(body.error().message);
  return adapter_error(route, *body, ctx);
}

void expect_too_deep(const std::optional<ApiError>& e, const std::string& what) {
  ASSERT_TRUE(e.has_value()) << what << ": accepted";
  EXPECT_EQ(e->kind, ApiErrorKind::INVALID_REQUEST) << what;
  EXPECT_EQ(e->status(), 400) << what;
  EXPECT_NE(e->message.find(k_too_deep), std::string::npos) << what << ": " << e->message;
}

// A request field that takes arbitrary JSON. `tmpl` is the body with '@' where
// the deep JSON goes; `pointer` locates it in the parsed body. With
// `in_string`, '@' is a JSON string (tool-call arguments as text) whose
// content is {"q": <deep JSON>}.
struct FieldCase {
  const char* name;
  Route route;
  const char* tmpl;
  const char* pointer;
  bool in_string = false;
};

const std::vector<FieldCase>& field_cases() {
  static const std::vector<FieldCase> cases = {
      {"chat tools[].function.parameters", Route::CHAT,
       R"({"messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "f", "parameters":
             {"type": "object", "properties": {"p": @}}}}]})",
       "/tools/0/function/parameters/properties/p"},
      {"chat system message tools", Route::CHAT,
       R"({"messages": [{"role": "system", "content": "s", "tools": [{"type": "function", "function":
             {"name": "g", "parameters": @}}]}, {"role": "user", "content": "hi"}]})",
       "/messages/0/tools/0/function/parameters"},
      {"chat response_format json_schema", Route::CHAT,
       R"({"messages": [{"role": "user", "content": "hi"}],
           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
             {"type": "object", "properties": {"p": @}}}}})",
       "/response_format/json_schema/schema/properties/p"},
      {"chat system message response_format", Route::CHAT,
       R"({"messages": [{"role": "system", "content": "s", "response_format": {"type": "json_object", "x": @}},
                        {"role": "user", "content": "hi"}]})",
       "/messages/0/response_format/x"},
      {"chat assistant tool_calls arguments object", Route::CHAT,
       R"({"messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                          "function": {"name": "f", "arguments": {"q": @}}}]},
                        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})",
       "/messages/1/tool_calls/0/function/arguments/q"},
      {"chat assistant tool_calls arguments string", Route::CHAT,
       R"({"messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                          "function": {"name": "f", "arguments": @}}]},
                        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})",
       "/messages/1/tool_calls/0/function/arguments", true},
      {"responses tools[].parameters", Route::RESPONSES,
       R"({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters":
             {"type": "object", "properties": {"p": @}}}]})",
       "/tools/0/parameters/properties/p"},
      {"responses text.format json_schema", Route::RESPONSES,
       R"({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema":
             {"type": "object", "properties": {"p": @}}}}})",
       "/text/format/schema/properties/p"},
      {"responses function_call arguments string", Route::RESPONSES,
       R"({"input": [{"role": "user", "content": "hi"},
                     {"type": "function_call", "call_id": "c1", "name": "f", "arguments": @},
                     {"type": "function_call_output", "call_id": "c1", "output": "ok"}]})",
       "/input/1/arguments", true},
      {"messages tools[].input_schema", Route::MESSAGES,
       R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
           "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"p": @}}}]})",
       "/tools/0/input_schema/properties/p"},
      {"messages tool_use input", Route::MESSAGES,
       R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"},
           {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"q": @}}]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]})",
       "/messages/1/content/0/input/q"},
      {"count_tokens tools[].input_schema", Route::COUNT_TOKENS,
       R"({"messages": [{"role": "user", "content": "hi"}],
           "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"p": @}}}]})",
       "/tools/0/input_schema/properties/p"},
      {"count_tokens tool_use input", Route::COUNT_TOKENS,
       R"({"messages": [{"role": "user", "content": "hi"},
           {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"q": @}}]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]})",
       "/messages/1/content/0/input/q"},
      {"chat unknown field", Route::CHAT, R"({"messages": [{"role": "user", "content": "hi"}], "x": @})", "/x"},
      {"completions prompt", Route::COMPLETIONS, R"({"prompt": @})", "/prompt"},
  };
  return cases;
}

// The body with `depth` levels of JSON at the placeholder: as text, and as a
// value built without parsing the deep part.
std::string body_text(const FieldCase& c, size_t depth, bool objects) {
  if (!c.in_string) return replace_placeholder(c.tmpl, deep_text(depth, objects));
  return replace_placeholder(c.tmpl, py_json_quote("{\"q\": " + deep_text(depth, objects) + "}"));
}

ordered_json body_value(const FieldCase& c, size_t depth, bool objects) {
  ordered_json body = ordered_json::parse(replace_placeholder(c.tmpl, "null"));
  ordered_json& slot = body[ordered_json::json_pointer(c.pointer)];
  if (c.in_string)
    slot = "{\"q\": " + deep_text(depth, objects) + "}";
  else
    slot = deep_value(depth, objects);  // (a move: the deep value is never copied)
  return body;
}

}  // namespace

TEST(ServerJsonLimits, ParseJsonTextCountsArraysAndObjectsAsOneLevelEach) {
  for (bool objects : {false, true}) {
    const std::string at_limit = deep_text(k_max_json_depth, objects);
    auto ok = parse_json_text(at_limit);
    ASSERT_TRUE(ok.has_value()) << ok.error().message;
    EXPECT_EQ(depth_of(*ok), 128u);
    EXPECT_TRUE(check_json_depth(*ok).has_value());
    EXPECT_TRUE(check_json_text_depth(at_limit).has_value());

    const std::string over = deep_text(k_max_json_depth + 1, objects);
    auto bad = parse_json_text(over);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().message.find(k_too_deep), std::string::npos) << bad.error().message;
    // The offset of the 129th opening bracket.
    const size_t offset = objects ? 128 * 6 : 128;
    EXPECT_NE(bad.error().message.find("at byte " + std::to_string(offset)), std::string::npos) << bad.error().message;
    auto value_error = check_json_depth(deep_value(k_max_json_depth + 1, objects));
    ASSERT_FALSE(value_error.has_value());
    EXPECT_NE(value_error.error().message.find(k_too_deep), std::string::npos);
  }
  // Mixed nesting; scalars are depth 0; brackets inside strings (escaped quotes included) do not nest.
  EXPECT_TRUE(parse_json_text("1").has_value());
  EXPECT_TRUE(parse_json_text("\"" + std::string(1000, '[') + "\"").has_value());
  EXPECT_TRUE(parse_json_text("[\"\\\"" + std::string(1000, '{') + "\\\\\"]").has_value());
  std::string mixed;
  for (size_t i = 0; i < 64; ++i) mixed += "[{\"k\": ";
  mixed += "null";
  for (size_t i = 0; i < 64; ++i) mixed += "}]";
  EXPECT_TRUE(parse_json_text(mixed).has_value());
  EXPECT_FALSE(parse_json_text("[" + mixed + "]").has_value());
  // Siblings do not add up: many shallow containers in a row are fine.
  std::string wide = "[";
  for (size_t i = 0; i < 10000; ++i) wide += i ? ", [[1]]" : "[[1]]";
  wide += "]";
  EXPECT_TRUE(parse_json_text(wide).has_value());
  // A syntax error within the limit is still reported as such.
  auto syntax = parse_json_text("[1,");
  ASSERT_FALSE(syntax.has_value());
  EXPECT_NE(syntax.error().message.find("invalid JSON"), std::string::npos);
}

TEST(ServerJsonLimits, DeepBodiesAreRefusedAtTheTopLevel) {
  Ctx c;
  for (Route route : {Route::CHAT, Route::RESPONSES, Route::MESSAGES, Route::COUNT_TOKENS, Route::COMPLETIONS}) {
    for (bool objects : {false, true}) {
      const std::string what = std::string(route_name(route)) + (objects ? " objects" : " arrays");
      expect_too_deep(route_error(route, deep_text(k_deep, objects), c.ctx), what + " (text)");
      expect_too_deep(adapter_error(route, deep_value(k_deep, objects), c.ctx), what + " (value)");
    }
  }
}

TEST(ServerJsonLimits, DeepJsonInEveryWalkedFieldIsRefused) {
  Ctx c;
  for (const FieldCase& fc : field_cases()) {
    for (bool objects : {false, true}) {
      const std::string what = std::string(fc.name) + (objects ? " (objects)" : " (arrays)");
      // As text through the route (a string field's content is checked by the adapter) ...
      expect_too_deep(route_error(fc.route, body_text(fc, k_deep, objects), c.ctx), what + ", text");
      // ... and as a value handed to the adapter directly.
      expect_too_deep(adapter_error(fc.route, body_value(fc, k_deep, objects), c.ctx), what + ", value");
    }
  }
}

TEST(ServerJsonLimits, ExactlyAtTheLimitIsAcceptedOneMoreIsRefused) {
  Ctx c;
  for (const FieldCase& fc : field_cases()) {
    if (fc.route == Route::COMPLETIONS) continue;  // a nested prompt is refused for its shape
    // Depth of the whole body, or of the arguments text for a string field ({"q": @} opens one level).
    const size_t base = fc.in_string ? 1 : depth_at_placeholder(fc.tmpl);
    ASSERT_LT(base, k_max_json_depth);
    for (bool objects : {false, true}) {
      const std::string what = std::string(fc.name) + (objects ? " (objects)" : " (arrays)");
      const size_t fill = k_max_json_depth - base;
      if (!fc.in_string) {
        auto body = parse_json_text(body_text(fc, fill, objects));
        ASSERT_TRUE(body.has_value()) << what << ": " << body.error().message;
        EXPECT_EQ(depth_of(*body), k_max_json_depth) << what;
      }
      auto accepted = route_error(fc.route, body_text(fc, fill, objects), c.ctx);
      EXPECT_FALSE(accepted.has_value()) << what << ": " << accepted->message;
      auto accepted_value = adapter_error(fc.route, body_value(fc, fill, objects), c.ctx);
      EXPECT_FALSE(accepted_value.has_value()) << what << ": " << accepted_value->message;

      expect_too_deep(route_error(fc.route, body_text(fc, fill + 1, objects), c.ctx), what + ", text, 129");
      expect_too_deep(adapter_error(fc.route, body_value(fc, fill + 1, objects), c.ctx), what + ", value, 129");
    }
  }
}

TEST(ServerJsonLimits, ToolCallArgumentTextErrorsNameTheField) {
  Ctx c;
  const FieldCase& chat = field_cases()[5];
  const FieldCase& responses = field_cases()[8];
  ASSERT_TRUE(chat.in_string && responses.in_string);
  auto e = route_error(chat.route, body_text(chat, k_deep, false), c.ctx);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message.rfind("messages[1].tool_calls[0].function: 'arguments': the JSON nests deeper than 128", 0), 0u)
      << e->message;
  auto r = route_error(responses.route, body_text(responses, k_deep, true), c.ctx);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->message.rfind("'input[1].arguments': the JSON nests deeper than 128", 0), 0u) << r->message;
  // Arguments text that is not JSON at all is still kept and rendered as one string parameter.
  auto lenient = route_error(chat.route, replace_placeholder(chat.tmpl, "\"not json [\""), c.ctx);
  EXPECT_FALSE(lenient.has_value()) << lenient->message;
}

TEST(ServerJsonLimits, WalkersOfModelAndStoredJsonStayBounded) {
  // py_json_dumps is iterative: any depth renders.
  const std::string deep = deep_text(k_deep, true);
  EXPECT_EQ(py_json_dumps(deep_value(k_deep, true)), deep);
  EXPECT_EQ(py_json_dumps(deep_value(3, false)), "[[[1]]]");
  EXPECT_EQ(py_json_dumps(ordered_json::parse(R"({"a": [], "b": {}, "c": [1, {"d": "e"}]})")),
            R"({"a": [], "b": {}, "c": [1, {"d": "e"}]})");

  // Exact-replay comparison of arguments: deep text is never equivalent (and never compared recursively).
  EXPECT_FALSE(json_text_equivalent(deep, deep));
  EXPECT_TRUE(json_text_equivalent(R"({"a": 1, "b": [2]})", R"({"b":[2],"a":1})"));

  // A reply checked against response_format: nesting past the limit is not JSON the server accepts.
  EXPECT_FALSE(satisfies_response_format("{\"a\": " + deep_text(200, false) + "}", ResponseFormat::JSON_OBJECT));
  EXPECT_FALSE(satisfies_response_format(deep_text(200, false), ResponseFormat::JSON_SCHEMA));
  EXPECT_TRUE(satisfies_response_format(deep_text(k_max_json_depth, true), ResponseFormat::JSON_OBJECT));

  // The model's tool-call arguments: a non-string value deeper than the limit (less the arguments object's
  // own level) is passed as a string, so every call's arguments object parses within the limit.
  auto call_with = [](const std::string& value) {
    return parse_completion(call_block("f", dsml("<|parameter name=\"v\" string=\"false\">" + value + "</|parameter>")),
                            ThinkingMode::CHAT);
  };
  const ParsedMessage fits = call_with(deep_text(k_max_json_depth - 1, false));
  ASSERT_EQ(fits.tool_calls.size(), 1u);
  EXPECT_EQ(fits.tool_calls[0].arguments, "{\"v\": " + deep_text(k_max_json_depth - 1, false) + "}");
  EXPECT_TRUE(parse_json_text(fits.tool_calls[0].arguments).has_value());
  for (size_t depth : {k_max_json_depth, k_deep}) {
    const ParsedMessage m = call_with(deep_text(depth, false));
    ASSERT_EQ(m.tool_calls.size(), 1u);
    auto args = parse_json_text(m.tool_calls[0].arguments);
    ASSERT_TRUE(args.has_value()) << args.error().message;
    ASSERT_TRUE((*args)["v"].is_string());
    EXPECT_EQ((*args)["v"].get<std::string>(), deep_text(depth, false));
    ASSERT_FALSE(m.warnings.empty());
    EXPECT_NE(m.warnings.back().find("nests deeper than 127 levels"), std::string::npos) << m.warnings.back();
  }
}

TEST(ServerJsonLimits, IntegralFloatsOutOfRangeGetTheRangeMessage) {
  auto message = [](const char* body) {
    auto r = parse_anthropic_messages(ordered_json::parse(body), false);
    return r ? std::string() : r.error().message;
  };
  const char* msgs = R"("messages": [{"role": "user", "content": "x"}])";
  auto with = [&](const std::string& max_tokens) {
    return message(("{" + std::string(msgs) + ", \"max_tokens\": " + max_tokens + "}").c_str());
  };
  EXPECT_EQ(with("1e308"), "'max_tokens' must be between 1 and 2147483647, got 1e+308");
  EXPECT_EQ(with("-1e308"), "'max_tokens' must be between 1 and 2147483647, got -1e+308");
  EXPECT_EQ(with("1e19"), "'max_tokens' must be between 1 and 2147483647, got 1e+19");
  EXPECT_EQ(with("18446744073709551615"), "'max_tokens' must be between 1 and 2147483647, got 18446744073709551615");
  EXPECT_EQ(with("1.5"), "'max_tokens' must be an integer, got a fractional number");
  EXPECT_EQ(with("3e9"), "'max_tokens' must be between 1 and 2147483647, got 3000000000");
  EXPECT_EQ(with("\"5\""), "'max_tokens' must be an integer, got string");
  EXPECT_EQ(with("5.0"), "");
  // The full int64_t range still converts exactly (a seed just below 2^63).
  auto seed = parse_anthropic_messages(
      ordered_json::parse(std::string("{") + msgs + R"(, "max_tokens": 1, "seed": 9.2e18})"), false);
  ASSERT_TRUE(seed.has_value()) << seed.error().message;
  EXPECT_EQ(*seed->seed, 9200000000000000000u);
}

namespace {

// Runs a prepared request on the scripted engine the way the transport does
// and returns the reply body (with its usage).
ordered_json run_body(PreparedRequest& p, ScriptedBackend& b, ToolMemory& memory, JobOutcome* outcome = nullptr) {
  JobHooks h;
  std::vector<DsmlEvent> events;
  h.on_event = [&](const DsmlEvent& e) { events.push_back(e); };
  h.cancelled = [] { return false; };
  JobOutcome o = run_job(b, p.job, h);
  EXPECT_FALSE(o.error.has_value()) << (o.error ? o.error->message : "");
  ReplyAssembler assembler(p.policy, memory);
  std::vector<OutEvent> outs;
  for (const auto& e : events) assembler.on_event(e, outs);
  const FinalReply reply = assembler.finish(o, outs);
  if (outcome) *outcome = o;
  return p.writer->body(reply);
}

const char* k_weather_tools =
    R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";

}  // namespace

TEST(ServerForcedToolUsage, TheForcedOpenerCountsOnceAsCompletionTokens) {
  // tool_choice "required" without thinking: the opener ends in `invoke name="`; the model writes the rest.
  ToolMemory memory;
  auto b = make_backend({ScriptedReply{
      "", dsml("get_weather\">\n") + string_param("city", "Paris") + dsml("\n</|invoke>\n</|tool_calls>"), 0, 0}});
  ServeContext ctx{b->tokenizer(), 4096, ModelCatalog{"tiny", {}}, memory};
  const std::string text = std::string(R"({"model": "deepseek-chat", "tool_choice": "required", "tools": )") +
                           k_weather_tools + R"(, "messages": [{"role": "user", "content": "weather in Paris?"}]})";
  const size_t opener = b->tokenizer().encode_prompt(forced_tool_opener(""))->size();
  for (int round = 0; round < 2; ++round) {  // the second round finds prompt + opener in the live session
    auto p = prepare_openai_chat(ordered_json::parse(text), ctx);
    ASSERT_TRUE(p.has_value()) << p.error().message;
    ASSERT_EQ(p->job.forced_tool, ForcedTool::ANY);
    const size_t prompt = p->prompt_tokens;
    JobOutcome o;
    const ordered_json body = run_body(*p, *b, memory, &o);
    ASSERT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
    const ordered_json& u = body["usage"];
    const size_t completion = o.result.tokens.size();
    EXPECT_EQ(u["prompt_tokens"].get<size_t>(), prompt) << "round " << round;
    EXPECT_EQ(u["completion_tokens"].get<size_t>(), completion);
    EXPECT_GT(completion, opener);  // the opener and what the model wrote after it
    EXPECT_EQ(u["total_tokens"].get<size_t>(), prompt + completion);
    // Every token of the session after the job is counted exactly once.
    EXPECT_EQ(b->session_tokens().size(), prompt + completion);
    const size_t cached = u["prompt_tokens_details"]["cached_tokens"].get<size_t>();
    EXPECT_LE(cached, prompt);
    EXPECT_EQ(u["prompt_cache_miss_tokens"].get<size_t>(), prompt - cached);
    if (round == 1) {
      EXPECT_EQ(cached, prompt);  // (the session held prompt + opener)
    }
  }
}

TEST(ServerForcedToolUsage, NamedToolAnthropicAndAfterReasoning) {
  // Anthropic tool_choice {"type": "tool"} without thinking: input + output tokens = the session.
  {
    ToolMemory memory;
    auto b =
        make_backend({ScriptedReply{"", string_param("city", "Paris") + dsml("\n</|invoke>\n</|tool_calls>"), 0, 0}});
    ServeContext ctx{b->tokenizer(), 4096, ModelCatalog{"tiny", {}}, memory};
    auto p = prepare_anthropic_messages(ordered_json::parse(R"({"max_tokens": 100, "thinking": {"type": "disabled"},
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "weather in Paris?"}]})"),
                                        ctx);
    ASSERT_TRUE(p.has_value()) << p.error().message;
    const size_t prompt = p->prompt_tokens;
    JobOutcome o;
    const ordered_json body = run_body(*p, *b, memory, &o);
    EXPECT_EQ(body["stop_reason"], "tool_use");
    EXPECT_EQ(body["content"].back()["input"], ordered_json({{"city", "Paris"}}));
    const ordered_json& u = body["usage"];
    EXPECT_EQ(u["input_tokens"].get<size_t>() + u["cache_read_input_tokens"].get<size_t>(), prompt);
    EXPECT_EQ(u["output_tokens"].get<size_t>(), o.result.tokens.size());
    EXPECT_EQ(b->session_tokens().size(), prompt + o.result.tokens.size());
  }
  // With thinking the reasoning phase comes first; the same accounting.
  {
    ToolMemory memory;
    auto b = make_backend({
        ScriptedReply{"invoke name=\"", dsml("get_weather\">\n\n</|invoke>\n</|tool_calls>"), 0, 0},
        ScriptedReply{"", "I should look it up</think>ignored", 0, 0},
    });
    ServeContext ctx{b->tokenizer(), 4096, ModelCatalog{"tiny", {}}, memory};
    auto p = prepare_openai_chat(
        ordered_json::parse(std::string(R"({"tool_choice": "required", "tools": )") + k_weather_tools +
                            R"(, "messages": [{"role": "user", "content": "weather?"}]})"),
        ctx);
    ASSERT_TRUE(p.has_value()) << p.error().message;
    const size_t prompt = p->prompt_tokens;
    JobOutcome o;
    const ordered_json body = run_body(*p, *b, memory, &o);
    const ordered_json& u = body["usage"];
    EXPECT_EQ(u["prompt_tokens"].get<size_t>(), prompt);
    EXPECT_EQ(u["completion_tokens"].get<size_t>(), o.result.tokens.size());
    EXPECT_GT(u["completion_tokens_details"]["reasoning_tokens"].get<size_t>(), 0u);
    EXPECT_EQ(b->session_tokens().size(), prompt + o.result.tokens.size());
  }
}

TEST(ServerJsonLimits, OverHttpTheServerAnswers400AndKeepsServing) {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.model_id = "tiny";
  auto backend = make_backend({ScriptedReply{"", "fine", 0, 0}});
  HttpServer http(o, *backend);
  ASSERT_TRUE(http.bind().has_value());
  std::thread serving([&] { (void)http.serve(); });
  httplib::Client c("127.0.0.1", http.port());
  c.set_read_timeout(20, 0);
  const std::string schema_body = R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"p": )" +
                                  deep_text(k_deep, false) + "}}}]}";
  const std::string args_body = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant",
      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": )" +
                                py_json_quote("{\"q\": " + deep_text(k_deep, true) + "}") + "}}]}]}";
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"/v1/messages/count_tokens", schema_body},
      {"/v1/messages", schema_body},
      {"/v1/chat/completions", deep_text(k_deep, true)},
      {"/v1/chat/completions", args_body},
  };
  for (const auto& [path, body] : cases) {
    auto r = c.Post(path, body, "application/json");
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 400) << path;
    auto j = ordered_json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(k_too_deep), std::string::npos) << r->body;
  }
  auto ok = c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  http.shutdown(true);
  serving.join();
}
