/* fuzz_logwire.c: libFuzzer target for the log channel's decoders: the frame header, the
 * HELLO and CHALLENGE payloads and the handshake MAC check, driven over arbitrary bytes as
 * the server and the client meet them (a stream of frames, handshake caps first). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "logwire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t secret[TSP_WIRE_SECRET_LEN] = {1, 2, 3};
    char err[256];
    size_t off = 0;
    int authed = 0;
    uint8_t hello[TSP_WIRE_HELLO_MAX];
    size_t hello_len = 0;
    while (off < size) {
        tsp_wire_hdr_t h;
        uint32_t cap = authed ? TSP_WIRE_MAX_PAYLOAD : TSP_WIRE_MAX_HANDSHAKE;
        int rc = tsp_wire_hdr_unpack(&h, data + off, size - off, cap, err, sizeof err);
        if (rc)
            return 0;
        off += TSP_WIRE_HDR_LEN;
        if (size - off < h.length)
            return 0;
        const uint8_t *p = data + off;
        off += h.length;
        if (h.type == TSP_WIRE_HELLO) {
            tsp_wire_hello_t hh;
            if (tsp_wire_hello_unpack(&hh, p, h.length, err, sizeof err) == 0) {
                memcpy(hello, p, h.length);
                hello_len = h.length;
                uint8_t re[TSP_WIRE_HELLO_MAX];
                int n = tsp_wire_hello_pack(re, sizeof re, &hh);
                if (n < 0 || (size_t)n != h.length)
                    __builtin_trap(); /* a valid HELLO must pack back to its size */
            }
        } else if (h.type == TSP_WIRE_CHALLENGE) {
            uint16_t v;
            uint8_t nonce[TSP_WIRE_NONCE_LEN];
            tsp_wire_challenge_unpack(&v, nonce, p, h.length);
        } else if (h.type == TSP_WIRE_AUTH && hello_len) {
            uint8_t nonce[TSP_WIRE_NONCE_LEN] = {0};
            authed = tsp_wire_mac_verify(secret, 0, hello, hello_len, nonce, p, h.length) == 0;
            authed |= size > 4 && data[size - 1] == 0x5a; /* let the fuzzer reach open frames */
        } else if (h.type == TSP_WIRE_LINE || h.type == TSP_WIRE_ACK ||
                   h.type == TSP_WIRE_DROPPED || h.type == TSP_WIRE_OUT_BEGIN) {
            (void)tsp_wire_get_u64(p);
        }
    }
    return 0;
}
