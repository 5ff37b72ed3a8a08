# kh_add_fuzz_target(<target> SOURCES <core files> [LIBS <imported targets>])
# Fuzz targets live in core/fuzz/fuzz_<target>.c and define LLVMFuzzerTestOneInput.
# - Always: kh_replay_<target> links the target with replay_main.c (no libFuzzer, any compiler) and
#   ctest fuzz.replay.<target> runs it over core/fuzz/corpus/<target> and core/fuzz/regress/<target>.
# - With -DKH_FUZZ=ON (clang): kh_fuzz_<target> is the real libFuzzer binary.
option(KH_FUZZ "build libFuzzer targets (needs clang)" OFF)
function(kh_add_fuzz_target target)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS" ${ARGN})
  set(srcs)
  foreach(s ${F_SOURCES})
    list(APPEND srcs ${PROJECT_SOURCE_DIR}/core/${s})
  endforeach()
  set(main ${PROJECT_SOURCE_DIR}/core/fuzz/fuzz_${target}.c)
  add_executable(kh_replay_${target} ${main} ${PROJECT_SOURCE_DIR}/core/fuzz/replay_main.c ${srcs})
  target_include_directories(kh_replay_${target} PRIVATE ${PROJECT_SOURCE_DIR}/core)
  target_link_libraries(kh_replay_${target} PRIVATE PkgConfig::LIBUV ${F_LIBS})
  kh_target_defaults(kh_replay_${target})
  add_test(NAME fuzz.replay.${target}
    COMMAND kh_replay_${target} ${PROJECT_SOURCE_DIR}/core/fuzz/corpus/${target}
            ${PROJECT_SOURCE_DIR}/core/fuzz/regress/${target})
  if(KH_FUZZ)
    add_executable(kh_fuzz_${target} ${main} ${srcs})
    target_include_directories(kh_fuzz_${target} PRIVATE ${PROJECT_SOURCE_DIR}/core)
    target_compile_options(kh_fuzz_${target} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(kh_fuzz_${target} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(kh_fuzz_${target} PRIVATE PkgConfig::LIBUV ${F_LIBS})
  endif()
endfunction()
if(EXISTS ${PROJECT_SOURCE_DIR}/core/fuzz/targets.cmake)
  include(${PROJECT_SOURCE_DIR}/core/fuzz/targets.cmake)
endif()
