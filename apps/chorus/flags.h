// A small command-line flag parser for the `chorus` subcommands: `--name value`,
// `--name=value`, boolean `--name`, repeatable flags, generated `--help`. Unknown flags and
// malformed values are errors that name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::apps {

class Flags {
 public:
  Flags(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  // Declarations (before Parse). `def` is shown in --help and returned when the flag is absent.
  void String(const std::string& name, std::string def, std::string help);
  void Int(const std::string& name, int64_t def, std::string help);
  void Float(const std::string& name, double def, std::string help);
  void Bool(const std::string& name, std::string help);
  void Repeated(const std::string& name, std::string help);

  // Parses argv (after the subcommand). Returns kCancelled when --help was printed.
  Status Parse(int argc, char** argv);

  std::string GetString(const std::string& name) const;
  int64_t GetInt(const std::string& name) const;
  double GetFloat(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  bool IsSet(const std::string& name) const;
  std::vector<std::string> GetRepeated(const std::string& name) const;
  std::string Help() const;

 private:
  enum class Kind { kString, kInt, kFloat, kBool, kRepeated };
  struct Flag {
    Kind kind;
    std::string def, help;
    std::vector<std::string> values;
  };
  std::string command_, summary_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
};

}  // namespace chorus::apps
