// A rank that writes one line to stdout through the C library (`printf`) or the C++ streams
// (`cout`), without flushing, then waits until the file GO exists (at most 60 s) and says
// whether it did. Under a launcher that relays output as it comes the test sees the first line,
// creates GO, and reads "saw go"; where stdout is block-buffered the line only arrives at exit.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>

namespace {

bool wait_for(const char* path, int seconds) {
  struct stat st;
  for (int i = 0; i < seconds * 20; ++i) {
    if (::stat(path, &st) == 0) return true;
    ::usleep(50 * 1000);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "printf") != 0 && std::strcmp(argv[1], "cout") != 0)) {
    std::fprintf(stderr, "usage: line_buffer_probe printf|cout GO_FILE\n");
    return 2;
  }
  const bool use_printf = std::strcmp(argv[1], "printf") == 0;
  if (use_printf) {
    std::printf("first line\n");
  } else {
    std::cout << "first line\n";
  }
  const char* verdict = wait_for(argv[2], 60) ? "saw go\n" : "no go\n";
  if (use_printf) {
    std::printf("%s", verdict);
  } else {
    std::cout << verdict;
  }
  return 0;
}
