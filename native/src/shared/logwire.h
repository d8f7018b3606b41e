/* logwire.h (internal): the framing of the driver log channel (docs/protocol.md, part 1).
 *
 * Pure pack/unpack functions over byte buffers, big-endian, capped, versioned; the
 * HMAC-SHA256 handshake transcript. No I/O here, so the decoders can be fuzzed alone.
 */
#ifndef TSP_LOGWIRE_H
#define TSP_LOGWIRE_H

#include <stdint.h>
#include "torchspark/common.h"

#define TSP_WIRE_VERSION 3 /* this agent and driver: inside TLS 1.3 (docs/protocol.md 1.10) */
/* The oldest HELLO version the driver accepts inside TLS (1: no DUMP). Agents of versions
 * 1 and 2 speak no TLS and never get that far (1.10, "An older agent"). */
#define TSP_WIRE_VERSION_MIN 1
#define TSP_WIRE_HDR_LEN 12u
#define TSP_WIRE_MAX_HANDSHAKE 1024u
#define TSP_WIRE_MAX_LINE (1u << 20)
#define TSP_WIRE_MAX_CHUNK (1u << 20)
#define TSP_WIRE_MAX_TEXT 1024u
#define TSP_WIRE_MAX_RANK ((1 << 24) - 1)
#define TSP_WIRE_MAX_EVENT (64u * 1024u) /* the JSON of one EVENT frame */
#define TSP_WIRE_SECRET_LEN TSP_SECRET_LEN
#define TSP_WIRE_NONCE_LEN 32u
#define TSP_WIRE_MAC_LEN 32u
#define TSP_WIRE_RUNID_LEN 16u
#define TSP_WIRE_DIGEST_LEN 32u
#define TSP_WIRE_HELLO_FIXED 77u /* HELLO payload without the host name */
#define TSP_WIRE_HELLO_MAX (TSP_WIRE_HELLO_FIXED + 255u)
#define TSP_WIRE_CHALLENGE_LEN 34u
/* TCP keepalive of the driver's accepted sockets (protocol 1.7): a silent peer is dead
 * after about 5 s. */
#define TSP_WIRE_KEEPIDLE_S 2
#define TSP_WIRE_KEEPINTVL_S 1
#define TSP_WIRE_KEEPCNT 3
#define TSP_WIRE_USER_TIMEOUT_MS 5000u
/* Application keepalive (protocol 1.7, "Silent agents"): a KEEPALIVE agent sends PING
 * after this long without sending a frame; the driver declares an agent silent after
 * TSP_WIRE_SILENT_MS without reading one. */
#define TSP_WIRE_PING_MS 1000
#define TSP_WIRE_SILENT_MS 5000
/* The largest payload of any frame type after the handshake: a LINE (seq + text). */
#define TSP_WIRE_MAX_PAYLOAD (8u + TSP_WIRE_MAX_LINE)

enum tsp_wire_type {
    TSP_WIRE_HELLO = 0x01,
    TSP_WIRE_CHALLENGE = 0x02,
    TSP_WIRE_AUTH = 0x03,
    TSP_WIRE_WELCOME = 0x04,
    TSP_WIRE_LINE = 0x10,
    TSP_WIRE_DROPPED = 0x11,
    TSP_WIRE_ACK = 0x12,
    TSP_WIRE_EVENT = 0x13,      /* control (protocol 1.7): u64 seq, u8 kind, JSON */
    TSP_WIRE_STOP = 0x14,       /* control: u8 reason, text */
    TSP_WIRE_DUMP = 0x15,       /* control, version 2: u32 request (the hang doctor, 1.9) */
    TSP_WIRE_PING = 0x16,       /* keepalive (protocol 1.7): empty */
    TSP_WIRE_CHECKPOINT = 0x17, /* control, version 2: u8 why (protocol 1.13) */
    TSP_WIRE_OUT_BEGIN = 0x20,
    TSP_WIRE_OUT_CHUNK = 0x21,
    TSP_WIRE_OUT_END = 0x22,
    TSP_WIRE_OUT_DONE = 0x23,
    TSP_WIRE_CLOSE = 0x30,
    TSP_WIRE_ERROR = 0x31,
};

enum { TSP_WIRE_ROLE_LOGS = 1, TSP_WIRE_ROLE_OUTPUT = 2 };
enum {
    TSP_WIRE_HELLO_DROP = 1u << 0,
    TSP_WIRE_HELLO_CONTROL = 1u << 1,
    TSP_WIRE_HELLO_KEEPALIVE = 1u << 2 /* with CONTROL: PING when idle (protocol 1.7) */
};
/* WELCOME header flags: the driver accepted CONTROL (EVENT may be sent, STOP may come). */
enum { TSP_WIRE_WELCOME_CONTROL = 1u << 0 };
/* ERROR header flags (driver -> agent, OUTPUT connections): the output is over the driver's
 * limit (spark.driver.maxResultSize): no retry, nor any other way, can deliver it (1.6). */
enum { TSP_WIRE_ERROR_OVER_LIMIT = 1u << 0 };
enum {
    TSP_WIRE_EVENT_FAILURE = 1,
    TSP_WIRE_EVENT_NODE = 2,
    TSP_WIRE_EVENT_NCCL_CHECK = 3,
    TSP_WIRE_EVENT_EXECUTOR_GONE = 4 /* stopped as its executor JVM died (protocol 1.7) */
};
enum { TSP_WIRE_CHECKPOINT_GROW = 1 }; /* CHECKPOINT's why: the run grows back */
enum { TSP_WIRE_STOP_FAILED = 1, TSP_WIRE_STOP_LOST = 2, TSP_WIRE_STOP_ENDED = 3 };

/* A decoded frame header. */
typedef struct tsp_wire_hdr {
    uint8_t type;
    uint8_t flags;
    uint8_t stream;
    int32_t rank;
    uint32_t length;
} tsp_wire_hdr_t;

/* A decoded HELLO payload. host is NUL-terminated. */
typedef struct tsp_wire_hello {
    uint16_t version;
    uint8_t role;
    uint8_t hflags;
    uint8_t run_id[TSP_WIRE_RUNID_LEN];
    uint64_t agent_id;
    uint8_t nonce[TSP_WIRE_NONCE_LEN];
    int32_t node_rank;
    char host[256];
} tsp_wire_hello_t;

/* Packs a header into 12 bytes. */
void tsp_wire_hdr_pack(uint8_t out[TSP_WIRE_HDR_LEN], const tsp_wire_hdr_t *h);
/* Unpacks and checks a header: known type, reserved byte 0, the type's payload size
 * rules, and length <= cap (pass TSP_WIRE_MAX_HANDSHAKE before authentication).
 * 0; -EAGAIN when len < 12 (need more bytes); -EBADMSG malformed; -EMSGSIZE over cap.
 * err (may be NULL) receives a sentence on failure. */
int tsp_wire_hdr_unpack(tsp_wire_hdr_t *h, const uint8_t *buf, size_t len, uint32_t cap, char *err,
                        size_t errlen);

/* HELLO payload: returns its length (<= TSP_WIRE_HELLO_MAX), or -EINVAL. */
int tsp_wire_hello_pack(uint8_t *out, size_t outlen, const tsp_wire_hello_t *h);
/* 0; -EPROTO bad magic; -EPROTONOSUPPORT other version (h->version set); -EBADMSG size
 * or field errors. */
int tsp_wire_hello_unpack(tsp_wire_hello_t *h, const uint8_t *p, size_t len, char *err,
                          size_t errlen);
/* version: the agent's own (protocol 1.9: a version-2 driver answers a version-1 agent in 1). */
void tsp_wire_challenge_pack(uint8_t out[TSP_WIRE_CHALLENGE_LEN], unsigned version,
                             const uint8_t nonce[TSP_WIRE_NONCE_LEN]);
/* 0, -EBADMSG (size), -EPROTONOSUPPORT (the driver speaks another version). */
int tsp_wire_challenge_unpack(uint16_t *version, uint8_t nonce[TSP_WIRE_NONCE_LEN],
                              const uint8_t *p, size_t len);

void tsp_wire_put_u64(uint8_t out[8], uint64_t v);
uint64_t tsp_wire_get_u64(const uint8_t in[8]);

/* The run id of a secret (protocol 1.1). 0 or -EIO. */
int tsp_wire_run_id(const uint8_t secret[TSP_WIRE_SECRET_LEN], uint8_t out[TSP_WIRE_RUNID_LEN]);
/* The MAC of one side of the handshake (server_side 0: AUTH, 1: WELCOME). 0 or -EIO. */
int tsp_wire_mac(const uint8_t secret[TSP_WIRE_SECRET_LEN], int server_side, const uint8_t *hello,
                 size_t hello_len, const uint8_t nonce_s[TSP_WIRE_NONCE_LEN],
                 uint8_t mac[TSP_WIRE_MAC_LEN]);
/* Constant-time check of a received MAC: 0 or -EACCES. */
int tsp_wire_mac_verify(const uint8_t secret[TSP_WIRE_SECRET_LEN], int server_side,
                        const uint8_t *hello, size_t hello_len,
                        const uint8_t nonce_s[TSP_WIRE_NONCE_LEN], const uint8_t *mac,
                        size_t mac_len);

/* The output's digest on the wire (OUT_END, OUT_DONE; protocol 1.6, 1.10.1): keyed, so that a
 * rewritten output cannot carry a matching one: HMAC-SHA256(K_out, sha256) with K_out =
 * HMAC-SHA256(secret, "torchspark output digest v1"), sha256 the output's plain SHA-256.
 * 0 or -EIO. */
int tsp_wire_output_digest(const uint8_t secret[TSP_WIRE_SECRET_LEN],
                           const uint8_t sha256[TSP_WIRE_DIGEST_LEN],
                           uint8_t out[TSP_WIRE_DIGEST_LEN]);

/* 64 hex digits -> 32 bytes (whitespace around is not accepted). 0 or -EINVAL. */
int tsp_wire_secret_parse(const char *hex, uint8_t out[TSP_WIRE_SECRET_LEN]);
/* 32 bytes -> 64 lowercase hex digits and a NUL. */
void tsp_wire_secret_hex(const uint8_t s[TSP_WIRE_SECRET_LEN], char out[65]);
/* Short name of a frame type for messages ("LINE", "?" when unknown). */
const char *tsp_wire_type_name(unsigned type);

#endif
