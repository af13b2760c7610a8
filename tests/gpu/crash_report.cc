// A crash report for the GPU test binary: on a fatal signal it writes to
// stderr the function that faulted and the functions whose return addresses
// lie on the stack above it, then dies of the signal as it would have. A run
// on a lent GPU machine (tools/gpu/run.sh) has no debugger that can unwind
// an optimised build, and a call through a null or stale pointer (a jump to
// address 0) leaves no frame to unwind at all; the word the call pushed,
// and those above it, still name the callers. The stack is scanned as a
// crash reporter does (every word a symbol covers, so some lines are stale
// frames): read it from the top.
//
// It installs itself when the binary starts (a static initializer); nothing
// calls it.
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "absl/debugging/symbolize.h"

namespace dray {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr int kStackWords = 512;  // 4 KiB above the stack pointer
constexpr int kMostCallers = 32;

void Write(const char* text) {
  const ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
  (void)ignored;
}

// WriteAddress writes "  LABEL 0x...: FUNCTION" and returns whether a
// symbol covers `address`.
bool WriteAddress(const char* label, uintptr_t address) {
  char symbol[512];
  const bool known = absl::Symbolize(reinterpret_cast<void*>(address), symbol, sizeof(symbol));
  if (!known) std::strcpy(symbol, "(no symbol)");
  char line[640];
  std::snprintf(line, sizeof(line), "  %s 0x%zx: %s\n", label, static_cast<size_t>(address),
                symbol);
  Write(line);
  return known;
}

void Report(int signal, siginfo_t* info, void* context) {
  char line[160];
  std::snprintf(line, sizeof(line), "\n*** crash report: %s at address 0x%zx\n", strsignal(signal),
                reinterpret_cast<size_t>(info->si_addr));
  Write(line);
#if defined(__x86_64__)
  const auto* registers = static_cast<ucontext_t*>(context)->uc_mcontext.gregs;
  WriteAddress("faulting instruction", static_cast<uintptr_t>(registers[REG_RIP]));
  const auto* stack = reinterpret_cast<const uintptr_t*>(registers[REG_RSP]);
  Write("  return addresses on the stack, innermost first:\n");
  int callers = 0;
  for (int i = 0; i < kStackWords && callers < kMostCallers; ++i) {
    char symbol[8];
    if (stack[i] == 0 || !absl::Symbolize(reinterpret_cast<void*>(stack[i]), symbol, 1)) continue;
    char label[32];
    std::snprintf(label, sizeof(label), "sp+%d", i * 8);
    WriteAddress(label, stack[i]);
    ++callers;
  }
#else
  (void)context;
  Write("  (the stack is read on x86-64 only)\n");
#endif
  ::signal(signal, SIG_DFL);  // and die of it, as without the report
  raise(signal);
}

bool InstallCrashReport() {
  struct sigaction action {};
  action.sa_sigaction = Report;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int signal : kSignals) sigaction(signal, &action, nullptr);
  return true;
}

[[maybe_unused]] const bool kCrashReportInstalled = InstallCrashReport();

}  // namespace
}  // namespace dray
