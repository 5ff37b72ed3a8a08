# kh_add_fuzz_target(<target> [CORE] SOURCES <core files> [LIBS <imported targets>])
# Fuzz targets live in core/fuzz/fuzz_<target>.c and define LLVMFuzzerTestOneInput.
# - Always: kh_replay_<target> links the target with replay_main.c (no libFuzzer, any compiler) and
#   ctest fuzz.replay.<target> runs it over core/fuzz/corpus/<target> and core/fuzz/regress/<target>.
# - With -DKH_FUZZ=ON (clang): kh_fuzz_<target> is the real libFuzzer binary; the target
#   kh_fuzz_targets builds every one of them and nothing else (.ci/test.sh, make fuzz).
# CORE: the target takes the whole engine (every core file but the TLS and HTTP/3 modules') and
# khcore's libraries: the replay links khcore's objects, the fuzz binary kh_fuzzcore's (the same
# files compiled once with the fuzzer's instrumentation), so no target compiles the engine again.
option(KH_FUZZ "build libFuzzer targets (needs clang)" OFF)
set(KH_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined)
if(KH_FUZZ)
  add_custom_target(kh_fuzz_targets)
  add_library(kh_fuzzcore OBJECT EXCLUDE_FROM_ALL ${KH_CORE_SOURCES})
  target_include_directories(kh_fuzzcore PUBLIC ${PROJECT_SOURCE_DIR}/core)
  get_target_property(kh_core_libs khcore INTERFACE_LINK_LIBRARIES)
  target_link_libraries(kh_fuzzcore PUBLIC ${kh_core_libs})
  target_compile_options(kh_fuzzcore PRIVATE ${KH_FUZZ_FLAGS})
endif()
function(kh_add_fuzz_target target)
  cmake_parse_arguments(F "CORE" "" "SOURCES;LIBS" ${ARGN})
  set(srcs)
  foreach(s ${F_SOURCES})
    list(APPEND srcs ${PROJECT_SOURCE_DIR}/core/${s})
  endforeach()
  set(main ${PROJECT_SOURCE_DIR}/core/fuzz/fuzz_${target}.c)
  add_executable(kh_replay_${target} ${main} ${PROJECT_SOURCE_DIR}/core/fuzz/replay_main.c ${srcs})
  target_include_directories(kh_replay_${target} PRIVATE ${PROJECT_SOURCE_DIR}/core)
  target_link_libraries(kh_replay_${target} PRIVATE PkgConfig::LIBUV ${F_LIBS})
  kh_target_defaults(kh_replay_${target})
  if(F_CORE)
    target_link_libraries(kh_replay_${target} PRIVATE khcore)
  endif()
  add_test(NAME fuzz.replay.${target}
    COMMAND kh_replay_${target} ${PROJECT_SOURCE_DIR}/core/fuzz/corpus/${target}
            ${PROJECT_SOURCE_DIR}/core/fuzz/regress/${target})
  if(KH_FUZZ)
    add_executable(kh_fuzz_${target} ${main} ${srcs})
    target_include_directories(kh_fuzz_${target} PRIVATE ${PROJECT_SOURCE_DIR}/core)
    target_compile_options(kh_fuzz_${target} PRIVATE ${KH_FUZZ_FLAGS})
    target_link_options(kh_fuzz_${target} PRIVATE ${KH_FUZZ_FLAGS})
    target_link_libraries(kh_fuzz_${target} PRIVATE PkgConfig::LIBUV ${F_LIBS})
    if(F_CORE)
      target_link_libraries(kh_fuzz_${target} PRIVATE kh_fuzzcore)
    endif()
    add_dependencies(kh_fuzz_targets kh_fuzz_${target})
  endif()
endfunction()
if(EXISTS ${PROJECT_SOURCE_DIR}/core/fuzz/targets.cmake)
  include(${PROJECT_SOURCE_DIR}/core/fuzz/targets.cmake)
endif()
