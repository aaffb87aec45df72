// Turns the worker's parser events into what a dialect presents, on the HTTP
// thread: assigns tool-call ids as calls start, applies the request's tool
// policy, and builds the final reply.
//
//   * allow_tool_calls false (no tools offered, or tool_choice "none"): tool-
//     call events are withheld; a block the model wrote anyway is handed back
//     as content at the end (its raw text), and the finish reason is "stop";
//   * parallel_tool_calls false: only the first call of a reply is presented;
//   * TOOL_CALLS_ABORTED (a malformed block): the ids handed out are dropped,
//     writers get CALLS_ABORTED to close what they opened, and the block's
//     text follows as content (it cannot be withdrawn from a stream);
//   * a finished reply with tool calls is remembered for exact replay
//     (tool_memory.h), unless calls were dropped.
#pragma once

#include <string>
#include <vector>

#include "runtime/job.h"
#include "runtime/tool_memory.h"

namespace dsv4::server {

enum class OutKind { REASONING, CONTENT, CALL_START, CALL_ARGS, CALL_END, CALLS_ABORTED };

struct OutEvent {
  OutKind kind = OutKind::CONTENT;
  size_t index = 0;  // CALL_*: the call's index in the reply
  std::string text;  // REASONING/CONTENT: the delta; CALL_START: the function name; CALL_ARGS: a JSON fragment
  std::string id;    // CALL_START: the call id
};

struct ReplyCall {
  std::string id, name, arguments;
};

struct FinalReply {
  std::string content;
  std::string reasoning;
  std::vector<ReplyCall> calls;
  FinishReason finish = FinishReason::STOP;
  std::string stop_string;  // the client stop string that ended the reply
  size_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0, reasoning_tokens = 0;
  std::vector<TokenLogprob> logprobs;
};

class ReplyAssembler {
 public:
  struct Policy {
    std::string id_prefix = "call_";  // "call_" (OpenAI, Responses) or "toolu_" (Anthropic)
    bool allow_tool_calls = true;
    bool parallel_tool_calls = true;
  };
  ReplyAssembler(Policy policy, runtime::ToolMemory& memory) : policy_(std::move(policy)), memory_(memory) {}

  void on_event(const DsmlEvent& e, std::vector<OutEvent>& out);
  // After a successful job; `out` receives trailing events (a withheld block as content).
  FinalReply finish(const runtime::JobOutcome& outcome, std::vector<OutEvent>& out);

 private:
  bool presented(size_t index) const { return policy_.allow_tool_calls && (policy_.parallel_tool_calls || index == 0); }

  Policy policy_;
  runtime::ToolMemory& memory_;
  std::vector<std::string> ids_;  // by call index, while the block is live
};

}  // namespace dsv4::server
