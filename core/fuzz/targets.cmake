kh_add_fuzz_target(h1_parse SOURCES kh_h1_parse.c kh_err.c)
# the HTTP/1.1 client: response reader (whole = two pieces = byte by byte) and request serializer
kh_add_fuzz_target(h1_client SOURCES kh_h1_client.c kh_h1_parse.c kh_err.c)
# the HTTP/2 client session fed server bytes, and the gzip/deflate/zstd decoders
kh_add_fuzz_target(h2_client SOURCES kh_h2_client.c kh_http_decode.c kh_err.c LIBS ${KH_NGHTTP2} ${KH_DECODE_LIBS})
kh_add_fuzz_target(router SOURCES kh_router.c kh_path.c kh_err.c)
# the path normaliser alone (kh_path.h: normal form, idempotence, no ".." left, bounds)
kh_add_fuzz_target(path SOURCES kh_path.c)
# the TLS 1.3 record layer alone: it needs libcrypto, nothing of the loop
kh_add_fuzz_target(tls13 SOURCES kh_tls13.c kh_buf.c kh_err.c LIBS PkgConfig::OPENSSL)
# h2_conn drives the whole connection stack (kh_conn, kh_h1, kh_h2, kh_stream, ...): CORE, every
# core file but those of the TLS module (khamsin-tls.so, which it never loads) and the HTTP/3 one,
# compiled once for all CORE targets, and every library khcore links: a new core file needs no
# change here.
kh_add_fuzz_target(h2_conn CORE)
# the WebSocket session (kh_ws.c) with permessage-deflate (kh_ws_deflate.c) and the
# handshake/extension parsers
kh_add_fuzz_target(ws SOURCES kh_ws.c kh_ws_deflate.c kh_ws_handshake.c kh_sha1.c LIBS PkgConfig::ZLIB)
# conditional requests: HTTP-dates and entity-tag lists (kh_cond.h)
kh_add_fuzz_target(cond SOURCES kh_cond.c)
# Accept-Encoding negotiation and the gzip encoder (kh_compress.h)
kh_add_fuzz_target(compress SOURCES kh_compress.c kh_limits.c LIBS ${KH_COMPRESS_LIBS})
# the multipart/form-data parser alone: any chunking gives the same events (kh_multipart.h)
kh_add_fuzz_target(multipart SOURCES kh_multipart.c)
# the HTTP/3 stream side (kh_h3.c, nghttp3) without QUIC: kh_quic.h is stubbed in the target
if(TARGET PkgConfig::QUIC)
  kh_add_fuzz_target(h3_stream CORE SOURCES kh_h3.c LIBS PkgConfig::QUIC)
endif()
