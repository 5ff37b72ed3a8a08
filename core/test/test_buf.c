/* test_buf.c: growable buffers and the block cache: blocks are reused, bigger buffers are not
 * cached, consume keeps the tail. */
#include "kh_buf.h"
#include "kh_test.h"

int main(void)
{
    kh_bufcache c;
    kh_bufcache_init(&c, 2);
    kh_buf b = {0};
    kh_buf_append(&b, &c, "hello", 5);
    kh_is_int(b.cap, KH_BUF_BLOCK, "a small buffer is one block");
    kh_is_str(b.base, b.len, "hello", "appended");
    kh_buf_consume(&b, 2);
    kh_is_str(b.base, b.len, "llo", "consume keeps the tail");
    char *block = b.base;
    kh_buf_release(&b, &c);
    kh_ok(b.base == NULL && b.len == 0, "release empties the buffer");
    kh_is_int(c.count, 1, "the block went to the cache");
    kh_buf_append(&b, &c, "x", 1);
    kh_ok(b.base == block, "and is reused");

    kh_subtest("growth");
    char big[KH_BUF_BLOCK * 3];
    memset(big, 'a', sizeof big);
    kh_buf_append(&b, &c, big, sizeof big);
    kh_is_int(b.len, sizeof big + 1, "grew past one block");
    kh_ok(b.cap >= b.len, "capacity covers it");
    kh_buf_release(&b, &c);
    kh_is_int(c.count, 0, "a grown buffer is freed, not cached");

    kh_subtest("the cache is bounded");
    kh_buf bs[3] = {{0}};
    for (int i = 0; i < 3; i++)
        kh_buf_append(&bs[i], &c, "y", 1);
    for (int i = 0; i < 3; i++)
        kh_buf_release(&bs[i], &c);
    kh_is_int(c.count, 2, "no more than max blocks are kept");
    kh_bufcache_destroy(&c);
    return kh_test_done();
}
