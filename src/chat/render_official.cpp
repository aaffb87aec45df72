// The official DSV4 encoder (formats.md §4.2), in three passes like the
// reference: merge tool results into user turns and sort them into call order,
// drop old reasoning, then render turn by turn.
#include "chat/render_official.h"

#include <algorithm>
#include <map>
#include <string>

#include "chat/json_limits.h"
#include "chat/markers.h"
#include "chat/prompt_builder.h"
#include "chat/py_json.h"

namespace dsv4 {
namespace {

namespace mk = chat_marker;

// Think-Max prefix (formats.md §4.3): three lines, each ending "\n", then "\n".
constexpr std::string_view THINK_MAX_PREFIX =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

// Official tools block (formats.md §4.3) up to the schema lines, and after them.
constexpr std::string_view TOOLS_HEAD = R"TPL(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)TPL";
constexpr std::string_view TOOLS_TAIL =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

constexpr std::string_view RESPONSE_FORMAT_HEAD =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// A content block of a merged user turn.
struct UserBlock {
  enum class Kind { TEXT, TOOL_RESULT, UNSUPPORTED };
  Kind kind = Kind::TEXT;
  std::string text;                           // TEXT: the text; UNSUPPORTED: the part type
  std::string tool_use_id;                    // TOOL_RESULT
  const ChatContent* tool_content = nullptr;  // TOOL_RESULT
};

// A message after preprocessing. Tool messages no longer exist: they are
// TOOL_RESULT blocks of user turns.
struct Turn {
  ChatRole role = ChatRole::USER;
  const ChatMessage* msg = nullptr;    // source message; for a user turn the first user message, or null
                                       // when the turn was opened by a tool result
  std::vector<UserBlock> blocks;       // user turns only
  std::vector<const ChatTool*> tools;  // system/developer: the message's tools (+ request tools)
  bool drop_reasoning = false;

  ChatTask task() const { return msg ? msg->task : ChatTask::NONE; }
};

void append_user_blocks(Turn& turn, const ChatMessage& m) {
  if (!m.content.is_list) {
    turn.blocks.push_back(UserBlock{UserBlock::Kind::TEXT, m.content.text, "", nullptr});
    return;
  }
  for (const auto& part : m.content.parts) {
    if (part.type == "text")
      turn.blocks.push_back(UserBlock{UserBlock::Kind::TEXT, part.text, "", nullptr});
    else
      turn.blocks.push_back(UserBlock{UserBlock::Kind::UNSUPPORTED, part.type, "", nullptr});
  }
}

// Official merge_tool_messages: a tool result joins the user turn right before
// it (or opens one); a user message joins the user turn right before it unless
// that turn carries a task.
std::vector<Turn> merge_turns(const std::vector<ChatMessage>& messages) {
  std::vector<Turn> turns;
  for (const auto& m : messages) {
    switch (m.role) {
      case ChatRole::TOOL: {
        UserBlock b{UserBlock::Kind::TOOL_RESULT, "", m.tool_call_id, &m.content};
        if (turns.empty() || turns.back().role != ChatRole::USER) {
          Turn t;
          t.role = ChatRole::USER;
          turns.push_back(std::move(t));
        }
        turns.back().blocks.push_back(std::move(b));
        break;
      }
      case ChatRole::USER: {
        if (turns.empty() || turns.back().role != ChatRole::USER || turns.back().task() != ChatTask::NONE) {
          Turn t;
          t.role = ChatRole::USER;
          t.msg = &m;
          turns.push_back(std::move(t));
        }
        append_user_blocks(turns.back(), m);
        break;
      }
      case ChatRole::SYSTEM:
      case ChatRole::ASSISTANT:
      case ChatRole::DEVELOPER:
      case ChatRole::LATEST_REMINDER: {
        Turn t;
        t.role = m.role;
        t.msg = &m;
        for (const auto& tool : m.tools) t.tools.push_back(&tool);
        turns.push_back(std::move(t));
        break;
      }
    }
  }
  return turns;
}

// Official sort_tool_results_by_call_order: within each user turn, the
// tool_result blocks (only they) are stably reordered by the position of their
// id among the tool calls of the latest assistant message with tool calls;
// unknown ids sort as position 0.
void sort_tool_results(std::vector<Turn>& turns) {
  std::map<std::string, size_t> order;
  for (auto& t : turns) {
    if (t.role == ChatRole::ASSISTANT && !t.msg->tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < t.msg->tool_calls.size(); ++i) {
        const auto& id = t.msg->tool_calls[i].id;
        if (!id.empty()) order[id] = i;  // a repeated id keeps its last position, like a dict
      }
      continue;
    }
    if (t.role != ChatRole::USER || order.empty()) continue;
    std::vector<UserBlock*> slots;
    for (auto& b : t.blocks)
      if (b.kind == UserBlock::Kind::TOOL_RESULT) slots.push_back(&b);
    if (slots.size() < 2) continue;
    std::vector<UserBlock> results;
    for (auto* b : slots) results.push_back(*b);
    auto key = [&](const UserBlock& b) {
      auto it = order.find(b.tool_use_id);
      return it == order.end() ? size_t{0} : it->second;
    };
    std::stable_sort(results.begin(), results.end(),
                     [&](const UserBlock& a, const UserBlock& b) { return key(a) < key(b); });
    for (size_t i = 0; i < slots.size(); ++i) *slots[i] = std::move(results[i]);
  }
}

// Index of the last user or developer turn, or -1.
long last_user_index(const std::vector<Turn>& turns) {
  for (size_t i = turns.size(); i-- > 0;)
    if (turns[i].role == ChatRole::USER || turns[i].role == ChatRole::DEVELOPER) return static_cast<long>(i);
  return -1;
}

// Official _drop_thinking_messages: before the last user/developer turn,
// assistant turns lose their reasoning and developer turns are removed.
std::vector<Turn> drop_thinking(std::vector<Turn> turns) {
  const long last_user = last_user_index(turns);
  std::vector<Turn> out;
  for (size_t i = 0; i < turns.size(); ++i) {
    Turn& t = turns[i];
    const bool keep_role =
        t.role == ChatRole::USER || t.role == ChatRole::SYSTEM || t.role == ChatRole::LATEST_REMINDER;
    if (keep_role || static_cast<long>(i) >= last_user) {
      out.push_back(std::move(t));
    } else if (t.role == ChatRole::ASSISTANT) {
      t.drop_reasoning = true;
      out.push_back(std::move(t));
    }
  }
  return out;
}

void render_tools_block(PromptBuilder& b, const std::vector<const ChatTool*>& tools) {
  b.template_text(TOOLS_HEAD);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) b.text("\n");
    b.text(py_json_dumps(tools[i]->function));
  }
  b.template_text(TOOLS_TAIL);
}

void render_system_suffixes(PromptBuilder& b, const Turn& t) {
  if (!t.tools.empty()) {
    b.text("\n\n");
    render_tools_block(b, t.tools);
  }
  if (t.msg && t.msg->response_format) {
    b.text("\n\n");
    b.text(RESPONSE_FORMAT_HEAD);
    b.text(py_json_dumps(*t.msg->response_format));
  }
}

void render_user(PromptBuilder& b, const Turn& t) {
  b.control(mk::USER);
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    if (i) b.text("\n\n");
    const UserBlock& blk = t.blocks[i];
    switch (blk.kind) {
      case UserBlock::Kind::TEXT: b.text(blk.text); break;
      case UserBlock::Kind::UNSUPPORTED: b.text("[Unsupported " + blk.text + "]"); break;
      case UserBlock::Kind::TOOL_RESULT:
        b.text("<tool_result>");
        b.text(blk.tool_content->flattened());
        b.text("</tool_result>");
        break;
    }
  }
}

// One DSML parameter per argument (formats.md §4.4): string values raw with
// string="true", other values as Python JSON with string="false". Arguments
// that are not a JSON object become one string parameter `arguments`, and so
// do arguments nesting deeper than k_max_json_depth (the request adapters
// refuse those before rendering; parse_json_text refuses them here too).
void render_dsml_arguments(PromptBuilder& b, const ChatToolCall& call) {
  auto param = [&](std::string_view key, bool is_string, std::string_view value) {
    b.text("<");
    b.control(mk::DSML);
    b.text("parameter name=\"");
    b.text(key);
    b.text(is_string ? "\" string=\"true\">" : "\" string=\"false\">");
    b.text(value);
    b.text("</");
    b.control(mk::DSML);
    b.text("parameter>");
  };
  const auto args = parse_json_text(call.arguments);
  if (!args || !args->is_object()) {
    param("arguments", true, call.arguments);
    return;
  }
  bool first = true;
  for (const auto& [key, value] : args->items()) {
    if (!first) b.text("\n");
    first = false;
    if (value.is_string())
      param(key, true, value.get_ref<const std::string&>());
    else
      param(key, false, py_json_dumps(value));
  }
}

void render_dsml_tool_calls(PromptBuilder& b, const std::vector<ChatToolCall>& calls) {
  b.text("\n\n<");
  b.control(mk::DSML);
  b.text("tool_calls>\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) b.text("\n");
    b.text("<");
    b.control(mk::DSML);
    b.text("invoke name=\"");
    b.text(calls[i].name);
    b.text("\">\n");
    render_dsml_arguments(b, calls[i]);
    b.text("\n</");
    b.control(mk::DSML);
    b.text("invoke>");
  }
  b.text("\n</");
  b.control(mk::DSML);
  b.text("tool_calls>");
}

// Exact replay of a sampled block: its bytes verbatim, with each DSML marker
// a control piece as in render_dsml_tool_calls (so the block tokenizes the way
// the canonical rendering of the same text would); everything else, including
// marker-like text inside parameter values, stays text.
void render_raw_dsml(PromptBuilder& b, std::string_view raw) {
  while (!raw.empty()) {
    const size_t p = raw.find(mk::DSML);
    if (p == std::string_view::npos) {
      b.text(raw);
      return;
    }
    b.text(raw.substr(0, p));
    b.control(mk::DSML);
    raw.remove_prefix(p + mk::DSML.size());
  }
}

std::string_view task_marker(ChatTask task) {
  switch (task) {
    case ChatTask::NONE: break;
    case ChatTask::ACTION: return mk::TASK_ACTION;
    case ChatTask::QUERY: return mk::TASK_QUERY;
    case ChatTask::AUTHORITY: return mk::TASK_AUTHORITY;
    case ChatTask::DOMAIN: return mk::TASK_DOMAIN;
    case ChatTask::TITLE: return mk::TASK_TITLE;
    case ChatTask::READ_URL: return mk::TASK_READ_URL;
  }
  DSV4_UNREACHABLE();
}

struct RenderState {
  const std::vector<Turn>& turns;
  bool thinking;
  bool drop_thinking;
  bool think_max;
  long last_user;
};

// Official render_message for turns[index], followed by the transition.
Status render_turn(PromptBuilder& b, const RenderState& st, size_t index) {
  const Turn& t = st.turns[index];
  if (index == 0 && st.think_max) b.text(THINK_MAX_PREFIX);
  switch (t.role) {
    case ChatRole::SYSTEM:
      b.text(t.msg ? t.msg->content.flattened() : std::string());
      render_system_suffixes(b, t);
      break;
    case ChatRole::DEVELOPER: {
      const std::string content = t.msg->content.flattened();
      if (content.empty()) return make_error("message %zu: a developer message needs non-empty content", index);
      b.control(mk::USER);
      b.text(content);
      render_system_suffixes(b, t);
      break;
    }
    case ChatRole::USER: render_user(b, t); break;
    case ChatRole::LATEST_REMINDER:
      b.control(mk::LATEST_REMINDER);
      b.text(t.msg->content.flattened());
      break;
    case ChatRole::ASSISTANT: {
      const ChatMessage& m = *t.msg;
      const bool prev_has_task = index > 0 && st.turns[index - 1].task() != ChatTask::NONE;
      if (st.thinking && !prev_has_task && (!st.drop_thinking || static_cast<long>(index) > st.last_user)) {
        if (!t.drop_reasoning && m.reasoning_content) b.text(*m.reasoning_content);
        b.control(mk::THINK_END);
      }
      b.text(m.content.flattened());
      if (m.raw_dsml)
        render_raw_dsml(b, *m.raw_dsml);
      else if (!m.tool_calls.empty())
        render_dsml_tool_calls(b, m.tool_calls);
      if (!m.wo_eos) b.control(mk::EOS);
      break;
    }
    case ChatRole::TOOL: DSV4_ASSERT(false, "tool messages are merged before rendering");
  }

  // Transition: only when the next turn is an assistant / latest_reminder turn
  // or this is the last turn.
  if (index + 1 < st.turns.size()) {
    const ChatRole next = st.turns[index + 1].role;
    if (next != ChatRole::ASSISTANT && next != ChatRole::LATEST_REMINDER) return {};
  }
  if (t.task() != ChatTask::NONE) {
    if (t.task() == ChatTask::ACTION) {
      b.control(mk::ASSISTANT);
      b.control(st.thinking ? mk::THINK_START : mk::THINK_END);
    }
    b.control(task_marker(t.task()));
  } else if (t.role == ChatRole::USER || t.role == ChatRole::DEVELOPER) {
    b.control(mk::ASSISTANT);
    const bool open_thinking = st.thinking && (!st.drop_thinking || static_cast<long>(index) >= st.last_user);
    b.control(open_thinking ? mk::THINK_START : mk::THINK_END);
  }
  return {};
}

}  // namespace

expected<RenderedPrompt> render_official(const std::vector<ChatMessage>& messages, const RenderOptions& options) {
  std::vector<Turn> turns = merge_turns(messages);
  sort_tool_results(turns);

  if (!options.tools.empty()) {
    if (turns.empty() || turns.front().role != ChatRole::SYSTEM) {
      Turn sys;
      sys.role = ChatRole::SYSTEM;
      turns.insert(turns.begin(), std::move(sys));
    }
    for (const auto& tool : options.tools) turns.front().tools.push_back(&tool);
  }

  const bool thinking = options.thinking_mode == ThinkingMode::THINKING;
  bool drop = options.drop_thinking;
  for (const auto& t : turns)
    if (!t.tools.empty()) drop = false;
  if (thinking && drop) turns = drop_thinking(std::move(turns));

  const RenderState st{turns, thinking, drop, thinking && options.reasoning_effort == ReasoningEffort::MAX,
                       last_user_index(turns)};
  PromptBuilder b;
  b.control(mk::BOS);
  for (size_t i = 0; i < turns.size(); ++i) DSV4_TRY(render_turn(b, st, i));
  return b.take();
}

}  // namespace dsv4
