kh_add_fuzz_target(h1_parse SOURCES kh_h1_parse.c kh_err.c)
kh_add_fuzz_target(router SOURCES kh_router.c kh_err.c)
kh_add_fuzz_target(h2_conn
  SOURCES kh_conn.c kh_h1.c kh_h1_parse.c kh_h2.c kh_stream.c kh_buf.c kh_err.c kh_log.c kh_limits.c
          kh_router.c kh_timer.c kh_worker.c
  LIBS PkgConfig::NGHTTP2 Threads::Threads)
