// SIGINT/SIGTERM during a run, and the control channel to trainrun's agent. A signal is only
// recorded here; the loop acts on it at the end of a step, every rank at the same step
// (step.cpp).
#pragma once

#include <string>

namespace trainrun::core::stop {

/// Clears the recorded signal, opens the agent's control channel (TRAINRUN_CONTROL_FD) if there
/// is one, and installs the SIGINT/SIGTERM handlers, keeping the previous ones for restore().
void install();
/// Puts back the handlers install() replaced.
void restore();
/// The signal received since install() (0: none).
int received();
/// Records `sig` as received (the loop's way to end a one-rank run as a signal would).
void set_received(int sig);
/// One line to the agent ("saving N", "saved N"); nothing without a control channel.
void control_message(const std::string& msg);

}  // namespace trainrun::core::stop
