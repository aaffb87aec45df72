#include "run_repl.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

// GNU readline (Debian libreadline-dev). Its headers use FILE without
// including <stdio.h> themselves.
#include <readline/history.h>
#include <readline/readline.h>

#include "run_interrupt.h"

namespace dsv4::tools {

const char* repl_help_text() {
  return "commands:\n"
         "  /think          thinking mode (reasoning, then the answer)\n"
         "  /think-max      thinking with the Think-Max prefix (maximum reasoning effort)\n"
         "  /nothink        chat mode (answer directly, no reasoning)\n"
         "  /reset          forget the conversation (the system prompt stays)\n"
         "  /save FILE      save the conversation and the session state\n"
         "  /load FILE      load a conversation saved with /save\n"
         "  /help           this list\n"
         "  /exit, /quit    leave (Ctrl-D too)\n"
         "a line ending in \\ continues on the next line; start a message with // to send a leading /.\n"
         "Ctrl-C stops a reply (twice: exits while a reply is stopping), or clears the input line.\n";
}

namespace {

// --- line input (readline's callback interface, so Ctrl-C can be handled) ---

struct LineState {
  bool done = false;
  bool eof = false;
  std::string text;
};
LineState g_line;

void on_line(char* line) {
  g_line.done = true;
  g_line.eof = line == nullptr;
  if (line) {
    g_line.text = line;
    std::free(line);
  }
  // Stop readline from drawing the prompt again; it is installed per line.
  rl_callback_handler_remove();
}

const char* const k_commands[] = {"/think", "/think-max", "/nothink", "/reset", "/save",
                                  "/load",  "/help",      "/exit",    "/quit"};

char* command_generator(const char* text, int state) {
  static size_t next = 0;
  static size_t len = 0;
  if (state == 0) {
    next = 0;
    len = std::strlen(text);
  }
  while (next < std::size(k_commands)) {
    const char* c = k_commands[next++];
    if (std::strncmp(c, text, len) == 0) return strdup(c);  // readline frees it
  }
  return nullptr;
}

// Tab: /commands at the start of the line, file names after /save and /load,
// nothing elsewhere (a message is not a file name).
char** complete(const char* text, int start, int) {
  const std::string_view line(rl_line_buffer ? rl_line_buffer : "");
  if (start == 0 && !line.empty() && line[0] == '/') {
    rl_attempted_completion_over = 1;
    return rl_completion_matches(text, command_generator);
  }
  if (line.starts_with("/save ") || line.starts_with("/load ")) return nullptr;  // readline's file names
  rl_attempted_completion_over = 1;
  return nullptr;
}

// One input line: nullopt at end of input (Ctrl-D on an empty line); Ctrl-C
// abandons the line being typed and asks again.
std::optional<std::string> read_line(const std::string& prompt) {
  g_line = LineState{};
  rl_callback_handler_install(prompt.c_str(), on_line);
  while (!g_line.done) {
    pollfd p{0, POLLIN, 0};
    const int n = ::poll(&p, 1, -1);
    if (n < 0) {
      if (errno != EINTR) break;
      if (interrupt_pending()) {
        interrupt_clear();
        // "^C" where the cursor is, then a fresh prompt on the next line
        // (leaving readline's terminal mode returns the cursor to column 0,
        // so the newline comes first).
        std::fputs("^C\n", stdout);
        std::fflush(stdout);
        rl_replace_line("", 0);
        rl_callback_handler_remove();
        rl_callback_handler_install(prompt.c_str(), on_line);
      }
      continue;
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) rl_callback_read_char();
  }
  if (!g_line.done) {  // poll failed: treat as end of input
    rl_callback_handler_remove();
    return std::nullopt;
  }
  if (g_line.eof) return std::nullopt;
  return g_line.text;
}

// Readline prompts mark non-printing sequences with \001 ... \002 so the
// cursor arithmetic ignores them.
std::string make_prompt(const char* text, bool color) {
  if (!color) return text;
  return std::string("\001\x1b[1;32m\002") + text + "\001\x1b[0m\002";
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

class Repl {
 public:
  Repl(ChatSession& chat, const RunSettings& settings) : chat_(chat), settings_(settings), ansi_(settings.colors.err) {}
  int run();

 private:
  // Reads a message (joining backslash-continued lines); nullopt at end of input.
  std::optional<std::string> read_message();
  // Handles a /command; false when the REPL should end.
  bool command(const std::string& line);
  void send(const std::string& text);
  void say(const std::string& s) const { std::fprintf(stderr, "%s%s%s\n", ansi_.dim(), s.c_str(), ansi_.reset()); }
  void error(const std::string& s) const {
    std::fprintf(stderr, "%serror:%s %s\n", ansi_.red(), ansi_.reset(), s.c_str());
  }
  std::string mode_line() const {
    return strfmt("thinking: %s (%s)", thinking_level_name(chat_.thinking()), thinking_level_flag(chat_.thinking()));
  }

  ChatSession& chat_;
  const RunSettings& settings_;
  Ansi ansi_;
};

std::optional<std::string> Repl::read_message() {
  std::string text;
  const std::string first = make_prompt("> ", settings_.colors.out);
  const std::string more = make_prompt("... ", settings_.colors.out);
  for (bool cont = false;; cont = true) {
    auto line = read_line(cont ? more : first);
    if (!line) return cont ? std::optional<std::string>(text) : std::nullopt;
    if (!line->empty()) add_history(line->c_str());
    if (!line->empty() && line->back() == '\\') {
      text += line->substr(0, line->size() - 1);
      text += '\n';
      continue;
    }
    text += *line;
    return text;
  }
}

bool Repl::command(const std::string& line) {
  const size_t sp = line.find_first_of(" \t");
  const std::string name = line.substr(0, sp);
  const std::string arg = sp == std::string::npos ? "" : trim(std::string_view(line).substr(sp));
  auto set_level = [&](ThinkingLevel level) {
    chat_.set_thinking(level);
    say(mode_line());
    if (level == ThinkingLevel::MAX && chat_.context_size() < k_think_max_min_ctx)
      say(strfmt("note: the model card asks for a context of at least %u tokens for Think-Max (this one holds %u)",
                 k_think_max_min_ctx, chat_.context_size()));
  };
  if (name == "/exit" || name == "/quit") return false;
  if (name == "/help") {
    std::fputs(repl_help_text(), stderr);
  } else if (name == "/think") {
    set_level(ThinkingLevel::HIGH);
  } else if (name == "/think-max") {
    set_level(ThinkingLevel::MAX);
  } else if (name == "/nothink") {
    set_level(ThinkingLevel::NONE);
  } else if (name == "/reset") {
    chat_.reset();
    say("conversation cleared");
  } else if (name == "/save") {
    if (arg.empty()) {
      error("/save needs a file name: /save FILE");
    } else if (auto st = chat_.save(arg); !st) {
      error(st.error().message);
    } else {
      say(strfmt("saved %zu messages and %zu tokens of session state to %s", chat_.messages().size(),
                 chat_.session_tokens(), arg.c_str()));
    }
  } else if (name == "/load") {
    if (arg.empty()) {
      error("/load needs a file name: /load FILE");
    } else if (auto rep = chat_.load(arg); !rep) {
      error(rep.error().message);
    } else {
      say(strfmt("loaded %zu messages from %s; %s", rep->messages, arg.c_str(), mode_line().c_str()));
      if (rep->state_restored)
        say(strfmt("session state restored (%zu tokens)", chat_.session_tokens()));
      else
        say("session state not restored (" + rep->state_note + "); the history is prefilled on the next message");
    }
  } else {
    error("unknown command " + name + " (/help lists the commands; start a message with // to send a leading /)");
  }
  return true;
}

void Repl::send(const std::string& text) {
  ReplyPrinter printer(settings_.colors.out);
  auto r = chat_.reply(text, printer);
  if (!r) {
    error(r.error().message);
    if (r.error().message.find("context holds") != std::string::npos)
      say("/reset starts a new conversation; /save keeps this one first");
    return;
  }
  print_reply_report(*r, chat_.session_tokens(), chat_.context_size(), settings_.colors.err);
}

int Repl::run() {
  const EngineInfo& info = chat_.engine().info();
  std::fprintf(stderr,
               "%sdsv4 chat%s: %s, context %u tokens, %s\n"
               "%s/help lists the commands; Ctrl-C stops a reply; Ctrl-D or /exit quits.%s\n",
               ansi_.bold(), ansi_.reset(), info.model_name.c_str(), chat_.context_size(), mode_line().c_str(),
               ansi_.dim(), ansi_.reset());
  for (;;) {
    auto message = read_message();
    if (!message) {
      std::fputc('\n', stdout);
      break;
    }
    const std::string line = trim(*message);
    if (line.empty()) continue;
    if (line.starts_with("//")) {
      send(message->substr(message->find('/') + 1));
      continue;
    }
    if (line[0] == '/') {
      if (!command(line)) break;
      continue;
    }
    send(*message);
  }
  return 0;
}

}  // namespace

int run_repl(ChatSession& chat, const RunSettings& settings) {
  rl_readline_name = "dsv4";
  rl_catch_signals = 0;  // SIGINT is ours (run_interrupt.h)
  rl_attempted_completion_function = complete;
  interrupt_install();
  Repl repl(chat, settings);
  return repl.run();
}

}  // namespace dsv4::tools
