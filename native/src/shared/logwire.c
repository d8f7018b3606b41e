/* logwire.c: pack/unpack of the log channel's frames and the handshake's HMAC transcript
 * (docs/protocol.md, part 1). Byte by byte, big-endian; no struct ever goes on the wire. */
#include "logwire.h"
#include "util.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>

static const uint8_t wire_magic[4] = {'T', 'S', 'P', 'L'};

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void tsp_wire_put_u64(uint8_t out[8], uint64_t v)
{
    put_u32(out, (uint32_t)(v >> 32));
    put_u32(out + 4, (uint32_t)v);
}

uint64_t tsp_wire_get_u64(const uint8_t in[8])
{
    return (uint64_t)get_u32(in) << 32 | get_u32(in + 4);
}

const char *tsp_wire_type_name(unsigned type)
{
    switch (type) {
    case TSP_WIRE_HELLO:
        return "HELLO";
    case TSP_WIRE_CHALLENGE:
        return "CHALLENGE";
    case TSP_WIRE_AUTH:
        return "AUTH";
    case TSP_WIRE_WELCOME:
        return "WELCOME";
    case TSP_WIRE_LINE:
        return "LINE";
    case TSP_WIRE_DROPPED:
        return "DROPPED";
    case TSP_WIRE_ACK:
        return "ACK";
    case TSP_WIRE_EVENT:
        return "EVENT";
    case TSP_WIRE_STOP:
        return "STOP";
    case TSP_WIRE_DUMP:
        return "DUMP";
    case TSP_WIRE_PING:
        return "PING";
    case TSP_WIRE_CHECKPOINT:
        return "CHECKPOINT";
    case TSP_WIRE_OUT_BEGIN:
        return "OUT_BEGIN";
    case TSP_WIRE_OUT_CHUNK:
        return "OUT_CHUNK";
    case TSP_WIRE_OUT_END:
        return "OUT_END";
    case TSP_WIRE_OUT_DONE:
        return "OUT_DONE";
    case TSP_WIRE_CLOSE:
        return "CLOSE";
    case TSP_WIRE_ERROR:
        return "ERROR";
    default:
        return "?";
    }
}

void tsp_wire_hdr_pack(uint8_t out[TSP_WIRE_HDR_LEN], const tsp_wire_hdr_t *h)
{
    out[0] = h->type;
    out[1] = h->flags;
    out[2] = h->stream;
    out[3] = 0;
    put_u32(out + 4, (uint32_t)h->rank);
    put_u32(out + 8, h->length);
}

/* The payload size rule of each type: an exact size, or a range [min, max]. */
static int payload_rule(unsigned type, uint32_t *min, uint32_t *max)
{
    switch (type) {
    case TSP_WIRE_HELLO:
        *min = TSP_WIRE_HELLO_FIXED;
        *max = TSP_WIRE_HELLO_MAX;
        return 0;
    case TSP_WIRE_CHALLENGE:
        *min = *max = TSP_WIRE_CHALLENGE_LEN;
        return 0;
    case TSP_WIRE_AUTH:
    case TSP_WIRE_WELCOME:
        *min = *max = TSP_WIRE_MAC_LEN;
        return 0;
    case TSP_WIRE_LINE:
        *min = 8;
        *max = 8 + TSP_WIRE_MAX_LINE;
        return 0;
    case TSP_WIRE_EVENT:
        *min = 9;
        *max = 9 + TSP_WIRE_MAX_EVENT;
        return 0;
    case TSP_WIRE_STOP:
        *min = 1;
        *max = 1 + TSP_WIRE_MAX_TEXT;
        return 0;
    case TSP_WIRE_DUMP:
        *min = *max = 4;
        return 0;
    case TSP_WIRE_CHECKPOINT:
        *min = *max = 1;
        return 0;
    case TSP_WIRE_DROPPED:
    case TSP_WIRE_ACK:
    case TSP_WIRE_OUT_BEGIN:
        *min = *max = 8;
        return 0;
    case TSP_WIRE_OUT_CHUNK:
        *min = 1;
        *max = TSP_WIRE_MAX_CHUNK;
        return 0;
    case TSP_WIRE_OUT_END:
    case TSP_WIRE_OUT_DONE:
        *min = *max = TSP_WIRE_DIGEST_LEN;
        return 0;
    case TSP_WIRE_CLOSE:
    case TSP_WIRE_PING:
        *min = *max = 0;
        return 0;
    case TSP_WIRE_ERROR:
        *min = 1;
        *max = TSP_WIRE_MAX_TEXT;
        return 0;
    default:
        return -1;
    }
}

int tsp_wire_hdr_unpack(tsp_wire_hdr_t *h, const uint8_t *buf, size_t len, uint32_t cap, char *err,
                        size_t errlen)
{
    if (len < TSP_WIRE_HDR_LEN)
        return tsp__err(err, errlen, -EAGAIN, "truncated frame header (%zu of %u bytes)", len,
                        TSP_WIRE_HDR_LEN);
    h->type = buf[0];
    h->flags = buf[1];
    h->stream = buf[2];
    h->rank = (int32_t)get_u32(buf + 4);
    h->length = get_u32(buf + 8);
    uint32_t min, max;
    if (payload_rule(h->type, &min, &max))
        return tsp__err(err, errlen, -EBADMSG, "unknown frame type 0x%02x", h->type);
    if (buf[3] != 0)
        return tsp__err(err, errlen, -EBADMSG, "non-zero reserved byte in a %s frame",
                        tsp_wire_type_name(h->type));
    if (h->length > cap || h->length > max) {
        uint32_t lim = cap < max ? cap : max;
        return tsp__err(err, errlen, -EMSGSIZE, "%s frame of %u bytes is over the cap of %u",
                        tsp_wire_type_name(h->type), h->length, lim);
    }
    if (h->length < min)
        return tsp__err(err, errlen, -EBADMSG, "%s frame of %u bytes is too short (%u expected)",
                        tsp_wire_type_name(h->type), h->length, min);
    if (h->type == TSP_WIRE_LINE) {
        if (h->stream != 1 && h->stream != 2 && h->stream != 4) /* 4: REPORT (1.8) */
            return tsp__err(err, errlen, -EBADMSG, "LINE frame with unknown stream %u", h->stream);
        if (h->flags & ~3u)
            return tsp__err(err, errlen, -EBADMSG, "LINE frame with unknown flags 0x%02x",
                            h->flags);
    } else if ((h->type == TSP_WIRE_WELCOME || h->type == TSP_WIRE_ERROR) && !h->stream &&
               !(h->flags & ~1u)) {
        /* flags bit0: WELCOME's CONTROL accepted (protocol 1.7); ERROR's OVER_LIMIT, an
         * output the driver refuses for good (1.6) */
    } else if (h->flags || h->stream) {
        return tsp__err(err, errlen, -EBADMSG, "%s frame with non-zero flags or stream",
                        tsp_wire_type_name(h->type));
    }
    if ((h->type == TSP_WIRE_LINE || h->type == TSP_WIRE_DROPPED) &&
        (h->rank < 0 || h->rank > TSP_WIRE_MAX_RANK))
        return tsp__err(err, errlen, -EBADMSG, "%s frame with rank %d out of range",
                        tsp_wire_type_name(h->type), h->rank);
    if (h->type == TSP_WIRE_EVENT && (h->rank < -1 || h->rank > TSP_WIRE_MAX_RANK))
        return tsp__err(err, errlen, -EBADMSG, "%s frame with rank %d out of range",
                        tsp_wire_type_name(h->type), h->rank);
    return 0;
}

int tsp_wire_hello_pack(uint8_t *out, size_t outlen, const tsp_wire_hello_t *h)
{
    size_t hl = strnlen(h->host, sizeof(h->host));
    if (hl > 255 || outlen < TSP_WIRE_HELLO_FIXED + hl)
        return -EINVAL;
    memcpy(out, wire_magic, 4);
    out[4] = (uint8_t)(h->version >> 8);
    out[5] = (uint8_t)h->version;
    out[6] = h->role;
    out[7] = h->hflags;
    memcpy(out + 8, h->run_id, TSP_WIRE_RUNID_LEN);
    tsp_wire_put_u64(out + 24, h->agent_id);
    memcpy(out + 32, h->nonce, TSP_WIRE_NONCE_LEN);
    put_u32(out + 64, (uint32_t)h->node_rank);
    memset(out + 68, 0, 8);
    out[76] = (uint8_t)hl;
    memcpy(out + 77, h->host, hl);
    return (int)(TSP_WIRE_HELLO_FIXED + hl);
}

int tsp_wire_hello_unpack(tsp_wire_hello_t *h, const uint8_t *p, size_t len, char *err,
                          size_t errlen)
{
    memset(h, 0, sizeof(*h));
    if (len < 6 || memcmp(p, wire_magic, 4) != 0)
        return tsp__err(err, errlen, -EPROTO, "bad magic: not a torchspark log client");
    h->version = (uint16_t)(p[4] << 8 | p[5]);
    if (h->version < TSP_WIRE_VERSION_MIN || h->version > TSP_WIRE_VERSION)
        return tsp__err(err, errlen, -EPROTONOSUPPORT,
                        "protocol version %u not supported; this driver speaks %u", h->version,
                        TSP_WIRE_VERSION);
    if (len < TSP_WIRE_HELLO_FIXED || len != TSP_WIRE_HELLO_FIXED + p[76])
        return tsp__err(err, errlen, -EBADMSG, "HELLO of %zu bytes does not match its host length",
                        len);
    h->role = p[6];
    h->hflags = p[7];
    if (h->role != TSP_WIRE_ROLE_LOGS && h->role != TSP_WIRE_ROLE_OUTPUT)
        return tsp__err(err, errlen, -EBADMSG, "unknown role %u", h->role);
    if (h->hflags &
        ~(unsigned)(TSP_WIRE_HELLO_DROP | TSP_WIRE_HELLO_CONTROL | TSP_WIRE_HELLO_KEEPALIVE))
        return tsp__err(err, errlen, -EBADMSG, "unknown HELLO flags 0x%02x", h->hflags);
    for (int i = 68; i < 76; i++)
        if (p[i])
            return tsp__err(err, errlen, -EBADMSG, "non-zero reserved bytes in HELLO");
    memcpy(h->run_id, p + 8, TSP_WIRE_RUNID_LEN);
    h->agent_id = tsp_wire_get_u64(p + 24);
    memcpy(h->nonce, p + 32, TSP_WIRE_NONCE_LEN);
    h->node_rank = (int32_t)get_u32(p + 64);
    /* The host name is only ever printed: keep printable ASCII, replace the rest. */
    for (size_t i = 0; i < p[76]; i++) {
        uint8_t c = p[77 + i];
        h->host[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    return 0;
}

void tsp_wire_challenge_pack(uint8_t out[TSP_WIRE_CHALLENGE_LEN], unsigned version,
                             const uint8_t nonce[TSP_WIRE_NONCE_LEN])
{
    out[0] = (uint8_t)(version >> 8);
    out[1] = (uint8_t)version;
    memcpy(out + 2, nonce, TSP_WIRE_NONCE_LEN);
}

int tsp_wire_challenge_unpack(uint16_t *version, uint8_t nonce[TSP_WIRE_NONCE_LEN],
                              const uint8_t *p, size_t len)
{
    if (len != TSP_WIRE_CHALLENGE_LEN)
        return -EBADMSG;
    *version = (uint16_t)(p[0] << 8 | p[1]);
    if (*version != TSP_WIRE_VERSION)
        return -EPROTONOSUPPORT;
    memcpy(nonce, p + 2, TSP_WIRE_NONCE_LEN);
    return 0;
}

int tsp_wire_run_id(const uint8_t secret[TSP_WIRE_SECRET_LEN], uint8_t out[TSP_WIRE_RUNID_LEN])
{
    static const char label[] = "torchspark-run-id";
    uint8_t d[EVP_MAX_MD_SIZE];
    unsigned dl = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
             EVP_DigestUpdate(c, label, sizeof(label) - 1) &&
             EVP_DigestUpdate(c, secret, TSP_WIRE_SECRET_LEN) && EVP_DigestFinal_ex(c, d, &dl);
    EVP_MD_CTX_free(c);
    if (!ok)
        return -EIO;
    memcpy(out, d, TSP_WIRE_RUNID_LEN);
    return 0;
}

int tsp_wire_output_digest(const uint8_t secret[TSP_WIRE_SECRET_LEN],
                           const uint8_t sha256[TSP_WIRE_DIGEST_LEN],
                           uint8_t out[TSP_WIRE_DIGEST_LEN])
{
    static const char label[] = "torchspark output digest v1";
    uint8_t k[EVP_MAX_MD_SIZE];
    unsigned kl = 0, ml = 0;
    int ok = HMAC(EVP_sha256(), secret, (int)TSP_WIRE_SECRET_LEN, (const unsigned char *)label,
                  sizeof(label) - 1, k, &kl) &&
             HMAC(EVP_sha256(), k, (int)kl, sha256, TSP_WIRE_DIGEST_LEN, out, &ml) &&
             ml == TSP_WIRE_DIGEST_LEN;
    OPENSSL_cleanse(k, sizeof(k));
    return ok ? 0 : -EIO;
}

int tsp_wire_mac(const uint8_t secret[TSP_WIRE_SECRET_LEN], int server_side, const uint8_t *hello,
                 size_t hello_len, const uint8_t nonce_s[TSP_WIRE_NONCE_LEN],
                 uint8_t mac[TSP_WIRE_MAC_LEN])
{
    const char *label = server_side ? "TSPL1 server" : "TSPL1 client";
    uint8_t msg[12 + TSP_WIRE_HELLO_MAX + TSP_WIRE_NONCE_LEN];
    if (hello_len > TSP_WIRE_HELLO_MAX)
        return -EINVAL;
    memcpy(msg, label, 12);
    memcpy(msg + 12, hello, hello_len);
    memcpy(msg + 12 + hello_len, nonce_s, TSP_WIRE_NONCE_LEN);
    unsigned ml = 0;
    if (!HMAC(EVP_sha256(), secret, (int)TSP_WIRE_SECRET_LEN, msg,
              12 + hello_len + TSP_WIRE_NONCE_LEN, mac, &ml) ||
        ml != TSP_WIRE_MAC_LEN)
        return -EIO;
    return 0;
}

int tsp_wire_mac_verify(const uint8_t secret[TSP_WIRE_SECRET_LEN], int server_side,
                        const uint8_t *hello, size_t hello_len,
                        const uint8_t nonce_s[TSP_WIRE_NONCE_LEN], const uint8_t *mac,
                        size_t mac_len)
{
    uint8_t want[TSP_WIRE_MAC_LEN];
    if (mac_len != TSP_WIRE_MAC_LEN)
        return -EACCES;
    if (tsp_wire_mac(secret, server_side, hello, hello_len, nonce_s, want))
        return -EACCES;
    return CRYPTO_memcmp(want, mac, TSP_WIRE_MAC_LEN) == 0 ? 0 : -EACCES;
}

int tsp_wire_secret_parse(const char *hex, uint8_t out[TSP_WIRE_SECRET_LEN])
{
    return tsp__hex_decode(hex, out, TSP_WIRE_SECRET_LEN);
}

void tsp_wire_secret_hex(const uint8_t s[TSP_WIRE_SECRET_LEN], char out[65])
{
    tsp__hex_encode(s, TSP_WIRE_SECRET_LEN, out);
}
