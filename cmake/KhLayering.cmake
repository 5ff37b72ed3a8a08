# The layering rule of style.md §2 as a ctest: core/ never includes a Lua header; lua/ never includes
# a protocol or transport header, nor nghttp2/ngtcp2/nghttp3/OpenSSL.
add_test(NAME layering
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/kh_check_layering.cmake)
