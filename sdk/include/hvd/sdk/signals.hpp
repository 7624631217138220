// signals.hpp — keeps the process's signal dispositions across a call into a library that may
// take them over. libfabric 1.17 links libinfinipath, which catches SIGINT, SIGTERM, SIGSEGV and
// others as it is loaded and again as its provider starts (fi_getinfo), and calls exit() from its
// handler: a process told to stop then hangs in atexit work, and its launcher never learns which
// signal ended it. A backend's libraries must leave the process's signals to the application.
#ifndef HVD_SDK_SIGNALS_HPP
#define HVD_SDK_SIGNALS_HPP

#include <signal.h>
#include <string.h>

#include <string>

namespace hvd::sdk {

// Saves every signal's disposition; restore_changed() puts back those that changed since.
class SignalDispositions {
 public:
  SignalDispositions() {
    for (int signal = 1; signal < NSIG; ++signal) {
      saved_[signal].valid = ::sigaction(signal, nullptr, &saved_[signal].action) == 0;
    }
  }

  // The names of the signals put back ("SIGINT, SIGTERM"), empty when none had changed.
  std::string restore_changed() const {
    std::string changed;
    for (int signal = 1; signal < NSIG; ++signal) {
      struct sigaction now {};
      if (!saved_[signal].valid || ::sigaction(signal, nullptr, &now) != 0) continue;
      const struct sigaction& was = saved_[signal].action;
      const bool info = (was.sa_flags & SA_SIGINFO) != 0;
      const bool same =
          (now.sa_flags & SA_SIGINFO) == (was.sa_flags & SA_SIGINFO) &&
          (info ? now.sa_sigaction == was.sa_sigaction : now.sa_handler == was.sa_handler);
      if (same) continue;
      (void)::sigaction(signal, &was, nullptr);
      const char* name = ::sigabbrev_np(signal);
      changed += (changed.empty() ? "SIG" : ", SIG") +
                 (name != nullptr ? std::string(name) : std::to_string(signal));
    }
    return changed;
  }

 private:
  struct Saved {
    bool valid = false;
    struct sigaction action {};
  };
  Saved saved_[NSIG];
};

}  // namespace hvd::sdk

#endif  // HVD_SDK_SIGNALS_HPP
