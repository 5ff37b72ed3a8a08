# kh_add_unit_test(<module> [CORE] SOURCES core files...): builds core/test/test_<module>.c against just
# the listed core sources (so one module's test does not wait on the whole engine) as
# kh_test_<module>, registered in ctest as unit.<module>. Output is TAP.
# CORE: the test takes the whole engine, khcore's objects (every core file but the TLS and HTTP/3
# modules') and its libraries, compiled once for the binary and every CORE test and replay.
function(kh_add_unit_test module)
  cmake_parse_arguments(T "CORE" "" "SOURCES;LIBS" ${ARGN})
  set(srcs)
  foreach(s ${T_SOURCES})
    list(APPEND srcs ${PROJECT_SOURCE_DIR}/core/${s})
  endforeach()
  add_executable(kh_test_${module} ${PROJECT_SOURCE_DIR}/core/test/test_${module}.c ${srcs})
  target_include_directories(kh_test_${module} PRIVATE ${PROJECT_SOURCE_DIR}/core ${PROJECT_SOURCE_DIR}/core/test)
  target_link_libraries(kh_test_${module} PRIVATE PkgConfig::LIBUV Threads::Threads ${T_LIBS})
  if(T_CORE)
    target_link_libraries(kh_test_${module} PRIVATE khcore)
  endif()
  kh_target_defaults(kh_test_${module})
  add_test(NAME unit.${module} COMMAND kh_test_${module})
endfunction()
