kh_add_fuzz_target(h1_parse SOURCES kh_h1_parse.c kh_err.c)
kh_add_fuzz_target(router SOURCES kh_router.c kh_err.c)
