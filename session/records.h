// What a session's profiles record of it (Profile::run), and the check that a profile is the
// session's own step. Tests: tests/test_cli.cpp.
#pragma once

#include <map>
#include <string>

#include "regen/remat/profile/profile.h"
#include "regen/session/options.h"

namespace regen {

// The options besides model, batch and device that shape a session's step, with the values it
// runs with, named as flags ("--optimizer": "adamw", "--image-size": "64"; every option of the
// model, the preset's included): what a profile records (Profile::run) and what a run planned from
// it must match.
std::map<std::string, std::string> run_flags(const SessionOptions& o);
// Refuses a profile recorded with other run_flags than `o` gives, naming the option, both values
// and what to do; `what` names the profile ("--profile FILE", "the profile"). A profile written
// before --math (--tf32 on|off) is read as --math tf32|fp32.
void check_profile_run(const Profile& p, const SessionOptions& o, const std::string& what);
// The math mode a profile's steps ran with: its --math (fp32 on the CPU), or its --tf32 on|off
// (CUDA profiles written before --math), else fp32 (profiles from before either was recorded).
std::string profile_math(const Profile& p);
// The precision a profile's steps ran in: its --precision, else its math mode (profiles from
// before --precision ran in fp32 or tf32).
std::string profile_precision(const Profile& p);

}  // namespace regen
