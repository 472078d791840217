// The `chorus` subcommands. Each parses its flags (flags.h), builds option structs and calls
// the library; none holds logic of its own beyond presentation.
#pragma once

namespace chorus::apps {

int GenerateCommand(int argc, char** argv);
int InspectCommand(int argc, char** argv);
int ConvertCommand(int argc, char** argv);
int BenchCommand(int argc, char** argv);
int ServeCommand(int argc, char** argv);
int EvalCommand(int argc, char** argv);
int CompressCommand(int argc, char** argv);
int RouterCommand(int argc, char** argv);
int ProfileCommand(int argc, char** argv);
int FinetuneCommand(int argc, char** argv);
int SimulateCommand(int argc, char** argv);

}  // namespace chorus::apps
