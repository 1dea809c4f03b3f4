#pragma once
// Multi-rank tests run as real processes under fsdprun (see tests/CMakeLists.txt): every rank
// runs the same tests in the same order, each joined to the others through real Gloo.

#include <fsdp/fsdp.h>

#include <string>

namespace fsdp_test {

/// The job this test process belongs to (set up once in dist_main.cpp).
fsdp::Distributed& dist();

/// A small text corpus generated from a fixed seed at configure time (tests/data/make_corpus.py).
std::string corpus_dir();

}  // namespace fsdp_test
