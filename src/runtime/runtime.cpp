#include "runtime/runtime.h"

namespace dsv4::runtime {

Runtime::Runtime(Backend& backend, size_t max_queue, JobObserver on_done)
    : backend_(backend), scheduler_(backend, max_queue, std::move(on_done)) {
  backend_.set_tool_memory(&tool_memory_);
}

Runtime::~Runtime() {
  scheduler_.stop();
  backend_.set_tool_memory(nullptr);
}

expected<ChatPrompt, RuntimeError> Runtime::prepare(std::vector<ChatMessage> messages, RenderOptions render,
                                                    bool check_context) {
  ChatPromptInput in;
  in.messages = std::move(messages);
  in.render = std::move(render);
  in.ctx = check_context ? context_size() : 0;
  in.tool_memory = &tool_memory_;
  in.find_tool_calls = [this](const std::vector<std::string>& ids) { return backend_.find_tool_calls(ids); };
  return prepare_chat_prompt(std::move(in), tokenizer());
}

JobOutcome Runtime::run(const std::shared_ptr<Job>& job, const std::function<void(const DsmlEvent&)>& on_event,
                        const std::function<void(uint64_t done, uint64_t total)>& on_progress) {
  if (on_progress) job->want_prefill_progress();
  switch (submit(job)) {
    case Admit::OK: break;
    case Admit::QUEUE_FULL: {
      JobOutcome o;
      o.error = RuntimeError{RuntimeErrorKind::INTERNAL, "the job queue is full", ""};
      return o;
    }
    case Admit::STOPPING: {
      JobOutcome o;
      o.error = RuntimeError{RuntimeErrorKind::INTERNAL, "the runtime is shutting down", ""};
      return o;
    }
  }
  std::vector<DsmlEvent> events;
  std::vector<Job::PrefillStep> steps;
  for (;;) {
    events.clear();
    steps.clear();
    const bool done = job->wait(events, std::chrono::milliseconds(100), &steps);
    if (on_progress)
      for (const auto& p : steps) on_progress(p.done, p.total);
    if (on_event)
      for (const auto& e : events) on_event(e);
    if (done) return job->outcome();
  }
}

void Runtime::shutdown(bool save_sessions) {
  if (shut_down_) return;
  shut_down_ = true;
  scheduler_.stop();
  backend_.shutdown(save_sessions);
}

}  // namespace dsv4::runtime
