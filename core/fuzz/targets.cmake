kh_add_fuzz_target(h1_parse SOURCES kh_h1_parse.c kh_err.c)
kh_add_fuzz_target(router SOURCES kh_router.c kh_err.c)
# the TLS 1.3 record layer alone: it needs libcrypto, nothing of the loop
kh_add_fuzz_target(tls13 SOURCES kh_tls13.c kh_buf.c kh_err.c LIBS PkgConfig::OPENSSL)
# h2_conn drives the whole connection stack (kh_conn, kh_h1, kh_h2, kh_stream, ...): it takes every
# core file and every library khcore links, so a new transport (kh_tls) needs no change here.
file(GLOB KH_CORE_NAMES RELATIVE ${PROJECT_SOURCE_DIR}/core ${PROJECT_SOURCE_DIR}/core/kh_*.c)
get_target_property(KH_CORE_LIBS khcore INTERFACE_LINK_LIBRARIES)
kh_add_fuzz_target(h2_conn SOURCES ${KH_CORE_NAMES} LIBS ${KH_CORE_LIBS})
