// The conversation layer: thinking-level mapping (formats.md §4.7), messages
// back to JSON, the saved-conversation file format, and the logprobs dump.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "chat/render_official.h"
#include "conversation/conversation_file.h"
#include "conversation/logprobs_json.h"
#include "conversation/message_json.h"
#include "chat/thinking.h"
#include "core/hash.h"
#include "core/utf8.h"
#include "synth/synth.h"
#include "tokenizer/stream_decoder.h"

using namespace dsv4;
using ordered_json = nlohmann::ordered_json;

namespace {

std::string tmp_dir() {
  static const std::string dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("dsv4_conv_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

// Removes the scratch folder when the test program ends.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(tmp_dir(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const g_cleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

struct TinyModel {
  std::unique_ptr<Engine> engine;
  TinyModel() {
    const std::string path = tmp_dir() + "/tiny.gguf";
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 5), path, 2).has_value());
    EngineOptions o;
    o.model_path = path;
    o.backend = BackendChoice::CPU;
    o.ctx = 512;
    o.show_progress = false;
    auto e = Engine::load(o);
    EXPECT_TRUE(e.has_value());
    if (e) engine = std::move(*e);
  }
};

TinyModel& tiny() {
  static TinyModel m;
  return m;
}

ChatMessage text_message(ChatRole role, std::string text) {
  ChatMessage m;
  m.role = role;
  m.content = ChatContent::from_text(std::move(text));
  return m;
}

std::vector<ChatMessage> sample_conversation() {
  auto parsed = from_openai_json(ordered_json::parse(R"([
    {"role": "system", "content": "Be brief.",
     "tools": [{"type": "function", "function": {"name": "ls", "description": "list",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}],
     "response_format": {"type": "json_object"}},
    {"role": "user", "content": [{"type": "text", "text": "look at"}, {"type": "image_url"}]},
    {"role": "assistant", "content": "", "reasoning_content": "need ls",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \"/tmp\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a\nb"},
    {"role": "user", "content": "thanks \u00e9\u4e2d", "task": "action"},
    {"role": "assistant", "content": "done", "wo_eos": true},
    {"role": "latest_reminder", "content": "today"}
  ])"));
  EXPECT_TRUE(parsed.has_value());
  return parsed ? *parsed : std::vector<ChatMessage>{};
}

}  // namespace

// --- thinking levels --------------------------------------------------------

TEST(Thinking, NamesFlagsAndAliases) {
  EXPECT_STREQ(thinking_level_name(ThinkingLevel::NONE), "none");
  EXPECT_STREQ(thinking_level_flag(ThinkingLevel::MAX), "--think-max");
  for (auto level : {ThinkingLevel::NONE, ThinkingLevel::HIGH, ThinkingLevel::MAX}) {
    auto back = thinking_level_from_string(thinking_level_name(level));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, level);
  }
  for (const char* alias : {"xhigh", "medium", "low", "minimal"}) {
    auto l = thinking_level_from_string(alias);
    ASSERT_TRUE(l.has_value()) << alias;
    EXPECT_EQ(*l, ThinkingLevel::HIGH) << alias;
  }
  auto bad = thinking_level_from_string("ultra");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("ultra"), std::string::npos);
}

TEST(Thinking, ContextRuleFollowsDs4) {
  EXPECT_EQ(thinking_level_for_ctx(ThinkingLevel::MAX, k_think_max_min_ctx - 1), ThinkingLevel::HIGH);
  EXPECT_EQ(thinking_level_for_ctx(ThinkingLevel::MAX, k_think_max_min_ctx), ThinkingLevel::MAX);
  EXPECT_EQ(thinking_level_for_ctx(ThinkingLevel::NONE, 16), ThinkingLevel::NONE);
  EXPECT_EQ(thinking_level_for_ctx(ThinkingLevel::HIGH, 16), ThinkingLevel::HIGH);
}

TEST(Thinking, RenderOptionsGiveTheDocumentedPrefixes) {
  const std::vector<ChatMessage> msgs = {text_message(ChatRole::USER, "Hi")};
  auto text = [&](ThinkingLevel level) {
    auto r = render_official(msgs, render_options_for(level));
    EXPECT_TRUE(r.has_value());
    return r ? rendered_text(*r) : std::string();
  };
  // formats.md §4.2 / §4.7: NONE ends A</think>, HIGH A<think>, MAX adds the
  // Think-Max prefix right after BOS.
  const std::string bos = "<｜begin▁of▁sentence｜>";
  EXPECT_EQ(text(ThinkingLevel::NONE), bos + "<｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(text(ThinkingLevel::HIGH), bos + "<｜User｜>Hi<｜Assistant｜><think>");
  const std::string max = text(ThinkingLevel::MAX);
  EXPECT_TRUE(max.starts_with(bos + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n")) << max;
  EXPECT_TRUE(max.ends_with("\n\n<｜User｜>Hi<｜Assistant｜><think>")) << max;
  EXPECT_EQ(parse_mode_for(ThinkingLevel::NONE), ThinkingMode::CHAT);
  EXPECT_EQ(parse_mode_for(ThinkingLevel::HIGH), ThinkingMode::THINKING);
  EXPECT_EQ(parse_mode_for(ThinkingLevel::MAX), ThinkingMode::THINKING);
  EXPECT_TRUE(render_options_for(ThinkingLevel::HIGH).drop_thinking);
}

TEST(Thinking, RecommendedSampling) {
  for (auto level : {ThinkingLevel::NONE, ThinkingLevel::HIGH, ThinkingLevel::MAX}) {
    const SamplingParams p = recommended_sampling(level);
    EXPECT_EQ(p.temperature, 1.0f);
    EXPECT_EQ(p.top_p, 1.0f);
    EXPECT_EQ(p.top_k, 0);
    EXPECT_FLOAT_EQ(p.min_p, 0.05f);
    EXPECT_EQ(p.repetition_penalty, 1.0f);
  }
}

// --- messages as JSON -------------------------------------------------------

TEST(MessageJson, RoundTripsEveryField) {
  const auto msgs = sample_conversation();
  ASSERT_EQ(msgs.size(), 7u);
  const ordered_json j = messages_to_openai_json(msgs);
  auto back = from_openai_json(j);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(messages_to_openai_json(*back).dump(), j.dump());
  // The JSON carries what the renderer needs: both render identically.
  RenderOptions ro = render_options_for(ThinkingLevel::HIGH);
  auto a = render_official(msgs, ro);
  auto b = render_official(*back, ro);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(rendered_text(*a), rendered_text(*b));
  // Spot checks of the shape.
  EXPECT_EQ(j[0]["tools"][0]["type"], "function");
  EXPECT_EQ(j[1]["content"][1], ordered_json({{"type", "image_url"}}));
  EXPECT_EQ(j[2]["reasoning_content"], "need ls");
  EXPECT_EQ(j[2]["tool_calls"][0]["function"]["arguments"], "{\"path\": \"/tmp\"}");
  EXPECT_EQ(j[3]["tool_call_id"], "call_1");
  EXPECT_EQ(j[4]["task"], "action");
  EXPECT_EQ(j[5]["wo_eos"], true);
  EXPECT_FALSE(j[1].contains("reasoning_content"));
  EXPECT_FALSE(j[1].contains("wo_eos"));
}

TEST(MessageJson, AssistantMessageFromParsedCompletion) {
  ParsedMessage p = parse_completion("think hard</think>the answer<｜end▁of▁sentence｜>", ThinkingMode::THINKING);
  ChatMessage m = assistant_message_from(p);
  EXPECT_EQ(m.role, ChatRole::ASSISTANT);
  EXPECT_EQ(m.content.text, "the answer");
  ASSERT_TRUE(m.reasoning_content.has_value());
  EXPECT_EQ(*m.reasoning_content, "think hard");
  ChatMessage plain = assistant_message_from(parse_completion("hello", ThinkingMode::CHAT));
  EXPECT_FALSE(plain.reasoning_content.has_value());
  EXPECT_EQ(plain.content.text, "hello");
}

// --- the conversation file ----------------------------------------------------

TEST(ConversationFile, EncodeDecodeRoundTrip) {
  SavedConversation c;
  c.thinking = ThinkingLevel::MAX;
  c.messages = sample_conversation();
  c.model_name = "tiny";
  c.model_path = "/x/tiny.gguf";
  c.n_vocab = 512;
  c.session = {1, 2, 3, 0, 255};
  const auto bytes = conversation_encode(c);
  ASSERT_GT(bytes.size(), 8u + 24u + 64u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "DSV4CONV");
  auto d = conversation_decode(bytes);
  ASSERT_TRUE(d.has_value()) << d.error().message;
  EXPECT_EQ(d->thinking, ThinkingLevel::MAX);
  EXPECT_EQ(d->model_name, "tiny");
  EXPECT_EQ(d->model_path, "/x/tiny.gguf");
  EXPECT_EQ(d->n_vocab, 512u);
  EXPECT_EQ(d->session, c.session);
  EXPECT_EQ(messages_to_openai_json(d->messages).dump(), messages_to_openai_json(c.messages).dump());
  // An empty conversation without session state is valid too.
  auto e = conversation_decode(conversation_encode(SavedConversation{}));
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->messages.empty());
  EXPECT_TRUE(e->session.empty());
  EXPECT_EQ(e->thinking, ThinkingLevel::HIGH);
}

TEST(ConversationFile, RejectsDamagedFilesWithClearErrors) {
  SavedConversation c;
  c.messages = {text_message(ChatRole::USER, "hi")};
  c.session = std::vector<uint8_t>(100, 7);
  const auto good = conversation_encode(c);
  auto error_of = [](std::vector<uint8_t> b) {
    auto r = conversation_decode(b);
    EXPECT_FALSE(r.has_value());
    return r ? std::string() : r.error().message;
  };
  EXPECT_NE(error_of({'h', 'e', 'l', 'l', 'o'}).find("not a dsv4 conversation file"), std::string::npos);
  EXPECT_NE(error_of(std::vector<uint8_t>(good.begin(), good.begin() + 20)).find("truncated"), std::string::npos);
  auto v = good;
  v[8] = 9;  // version 9
  EXPECT_NE(error_of(v).find("version 9 is not supported"), std::string::npos);
  v = good;
  v[12] = 1;  // a flag bit
  EXPECT_NE(error_of(v).find("unknown flags"), std::string::npos);
  v = good;
  v.resize(v.size() - 10);  // cut inside the snapshot and checksum
  EXPECT_NE(error_of(v).find("size mismatch"), std::string::npos);
  v = good;
  v[40] ^= 0x20;  // a byte of the JSON header
  EXPECT_NE(error_of(v).find("checksum mismatch"), std::string::npos);
  v = good;
  v[v.size() - 70] ^= 1;  // a byte of the snapshot
  EXPECT_NE(error_of(v).find("checksum mismatch"), std::string::npos);
}

TEST(ConversationFile, RejectsBadHeaderJson) {
  // A well-formed container whose JSON header is wrong: build one by hand.
  auto container = [](const std::string& json) {
    std::vector<uint8_t> out = {'D', 'S', 'V', '4', 'C', 'O', 'N', 'V', 1, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(json.size() >> (8 * i)));
    for (int i = 0; i < 8; ++i) out.push_back(0);
    out.insert(out.end(), json.begin(), json.end());
    const std::string digest = sha256_hex(out.data(), out.size());
    out.insert(out.end(), digest.begin(), digest.end());
    return out;
  };
  auto error_of = [&](const std::string& json) {
    auto r = conversation_decode(container(json));
    EXPECT_FALSE(r.has_value()) << json;
    return r ? std::string() : r.error().message;
  };
  EXPECT_NE(error_of("{not json").find("invalid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": 5})").find("dsv4-conversation"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "dsv4-conversation", "messages": []})").find("thinking"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "dsv4-conversation", "thinking": "huge", "messages": []})").find("huge"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "dsv4-conversation", "thinking": "none"})").find("messages"), std::string::npos);
  EXPECT_NE(
      error_of(R"({"format": "dsv4-conversation", "thinking": "none", "messages": [{"role": "robot"}]})").find("robot"),
      std::string::npos);
  auto ok = conversation_decode(container(R"({"format": "dsv4-conversation", "thinking": "none", "messages": []})"));
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  EXPECT_EQ(ok->thinking, ThinkingLevel::NONE);
}

TEST(ConversationFile, FilesAndInvalidUtf8) {
  SavedConversation c;
  c.messages = {text_message(ChatRole::USER, std::string("bad \xff\xfe bytes"))};
  const std::string path = tmp_dir() + "/conv.dsv4";
  ASSERT_TRUE(conversation_save_file(path, c).has_value());
  auto back = conversation_load_file(path);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  ASSERT_EQ(back->messages.size(), 1u);
  // Ill-formed bytes are stored as U+FFFD (the JSON header is UTF-8).
  EXPECT_TRUE(utf8_valid(back->messages[0].content.text));
  EXPECT_TRUE(back->messages[0].content.text.starts_with("bad "));
  EXPECT_TRUE(back->messages[0].content.text.ends_with(" bytes"));
  // No temporary file is left next to it.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp_dir()))
    files += e.path().filename().string().starts_with("conv.dsv4") ? 1 : 0;
  EXPECT_EQ(files, 1u);

  auto missing = conversation_load_file(tmp_dir() + "/nope.dsv4");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("cannot open"), std::string::npos);
  auto dir = conversation_load_file(tmp_dir());
  ASSERT_FALSE(dir.has_value());
  auto unwritable = conversation_save_file(tmp_dir() + "/no/such/dir/x.dsv4", c);
  ASSERT_FALSE(unwritable.has_value());
  EXPECT_NE(unwritable.error().message.find("cannot create"), std::string::npos);
  { std::ofstream(tmp_dir() + "/text.txt") << "just text\n"; }
  auto text = conversation_load_file(tmp_dir() + "/text.txt");
  ASSERT_FALSE(text.has_value());
  EXPECT_NE(text.error().message.find("not a dsv4 conversation file"), std::string::npos);
}

TEST(ConversationFile, CarriesAnExactSessionSnapshot) {
  ASSERT_NE(tiny().engine, nullptr);
  Engine& engine = *tiny().engine;
  auto s = engine.new_session();
  ASSERT_TRUE(s.has_value());
  const auto prompt = engine.tokenizer().encode("the saved conversation continues");
  ASSERT_TRUE((*s)->prefill(prompt).has_value());
  SavedConversation c;
  c.messages = {text_message(ChatRole::USER, "the saved conversation continues")};
  c.session = (*s)->save();
  const std::string path = tmp_dir() + "/with_state.dsv4";
  ASSERT_TRUE(conversation_save_file(path, c).has_value());
  auto back = conversation_load_file(path);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  auto s2 = engine.new_session();
  ASSERT_TRUE(s2.has_value());
  ASSERT_TRUE((*s2)->load(back->session).has_value());
  EXPECT_EQ((*s2)->tokens(), (*s)->tokens());
  // Continuing both gives bitwise the same logits.
  ASSERT_TRUE((*s)->decode(7).has_value());
  ASSERT_TRUE((*s2)->decode(7).has_value());
  EXPECT_EQ((*s2)->logits(), (*s)->logits());
}

// --- the logprobs dump -------------------------------------------------------

TEST(LogprobsJson, TokenTextIsValidUtf8AndKeepsRawBytes) {
  ordered_json a = token_to_json(5, "h\xc3\xa9");
  EXPECT_EQ(a["token"], 5);
  EXPECT_EQ(a["text"], "h\xc3\xa9");
  EXPECT_FALSE(a.contains("bytes"));
  // A token ending inside a two-byte character.
  ordered_json b = token_to_json(6, "x\xc3");
  EXPECT_EQ(b["text"], "x\xef\xbf\xbd");
  EXPECT_EQ(b["bytes"], ordered_json({120, 195}));
  EXPECT_TRUE(utf8_valid(b["text"].get<std::string>()));
}

TEST(LogprobsJson, ShapeOfADump) {
  ASSERT_NE(tiny().engine, nullptr);
  const Tokenizer& tok = tiny().engine->tokenizer();
  LogprobDump d;
  d.model = "tiny";
  d.prompt_tokens = 3;
  d.top_k = 2;
  d.finish = "length";
  TokenLogprob s1;
  s1.token = 10;
  s1.text = std::string(tok.token_bytes(10));
  s1.logprob = -0.5f;
  s1.top = {{10, -0.5f}, {11, -1.25f}};
  TokenLogprob s2;
  s2.token = 12;
  s2.text = "\xe4\xb8";  // the first two bytes of a CJK character
  s2.logprob = -std::numeric_limits<float>::infinity();
  s2.top = {{13, -0.1f}, {12, -2.0f}};
  d.steps = {s1, s2};
  const std::string path = tmp_dir() + "/lp.json";
  ASSERT_TRUE(logprobs_write_file(path, d, tok).has_value());
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(utf8_valid(text));
  auto j = parse_json_text(text);
  ASSERT_TRUE(j.has_value()) << j.error().message;
  EXPECT_EQ((*j)["format"], "dsv4-logprobs");
  EXPECT_EQ((*j)["prompt_tokens"], 3);
  EXPECT_EQ((*j)["top_k"], 2);
  EXPECT_EQ((*j)["finish"], "length");
  ASSERT_EQ((*j)["steps"].size(), 2u);
  const auto& st = (*j)["steps"][0];
  EXPECT_EQ(st["token"], 10);
  EXPECT_EQ(st["text"], utf8_lossy(tok.token_bytes(10)));
  EXPECT_FLOAT_EQ(st["logprob"].get<float>(), -0.5f);
  ASSERT_EQ(st["top"].size(), 2u);
  EXPECT_EQ(st["top"][1]["token"], 11);
  EXPECT_FLOAT_EQ(st["top"][1]["logprob"].get<float>(), -1.25f);
  EXPECT_EQ(st["top"][1]["text"], utf8_lossy(tok.token_bytes(11)));
  EXPECT_TRUE((*j)["steps"][1]["logprob"].is_null());
  EXPECT_EQ((*j)["steps"][1]["bytes"], ordered_json({0xe4, 0xb8}));
  EXPECT_EQ((*j)["text"], utf8_lossy(std::string(tok.token_bytes(10)) + "\xe4\xb8"));
}

TEST(LogprobsJson, FromARealGeneration) {
  ASSERT_NE(tiny().engine, nullptr);
  auto s = tiny().engine->new_session();
  ASSERT_TRUE(s.has_value());
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 6;
  o.ignore_eos = true;
  o.logprobs = 4;
  auto r = generate(**s, tiny().engine->tokenizer(), tiny().engine->tokenizer().encode("logprobs please"), o);
  ASSERT_TRUE(r.has_value());
  LogprobDump d;
  d.top_k = 4;
  d.steps = r->logprobs;
  ordered_json j = logprobs_to_json(d, tiny().engine->tokenizer());
  ASSERT_EQ(j["steps"].size(), 6u);
  for (const auto& st : j["steps"]) {
    ASSERT_EQ(st["top"].size(), 4u);
    EXPECT_EQ(st["top"][0]["token"], st["token"]);  // greedy
    float prev = 0;
    for (const auto& alt : st["top"]) {
      EXPECT_LE(alt["logprob"].get<float>(), prev);
      prev = alt["logprob"].get<float>();
    }
  }
}
