// The translation unit that builds the tests' precompiled header (tests/CMakeLists.txt,
// mirrored_test_pch); the header list is there.
