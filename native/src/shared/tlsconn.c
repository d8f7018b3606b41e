/* tlsconn.c: TLS 1.3 with an external pre-shared key from the run's secret, for every
 * connection of the driver log channel (docs/protocol.md 1.10). OpenSSL's libssl does the
 * protocol; this file owns the key derivation, the PSK callbacks, and the mapping of
 * OpenSSL's results onto the project's 0 / -errno convention. */
#include "tlsconn.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "macrec.h"
#include "util.h"

#define PSK_LEN TSP__TLS_KEY_LEN
#define WHY_LEN 256u

static const char PSK_SALT[] = "torchspark";
/* TLS_AES_128_GCM_SHA256: the PSK's session cipher (its hash, SHA-256, binds the PSK). */
static const unsigned char PSK_CIPHER[2] = {0x13, 0x01};
/* ALPN (docs/protocol.md 1.10.1): encrypted to the end, or MAC'ed records after the handshake. */
static const char ALPN_ENC[] = "torchspark/3";
static const char ALPN_MAC[] = "torchspark/3+mac";
static const char MAC_EXPORTER[] = "EXPORTER-torchspark-mac-v1";

struct tsp__tlsctx {
    SSL_CTX *ctx;
    int server;
    atomic_int modes; /* TSP__TLS_ENCRYPT | TSP__TLS_MAC: a client offers, a server picks one */
    uint8_t psk[PSK_LEN];
    uint8_t run_id[TSP_WIRE_RUNID_LEN];
};

struct tsp__tls {
    SSL *ssl;
    tsp__tlsctx_t *x;
    int fd;
    short want;
    int own_ctx;        /* tsp__tls_dial: x is freed with the connection */
    int foreign;        /* server: the client offered another run's identity */
    int refused_modes;  /* server: the ALPN modes of a client refused for its offer, else 0 */
    tsp__macrec_t *mac; /* encryption off: the records after the handshake (1.10.1) */
    uint8_t foreign_id[TSP_WIRE_RUNID_LEN];
    char why[WHY_LEN];
};

int tsp__tls_derive(const uint8_t secret[TSP_WIRE_SECRET_LEN], const char *label,
                    uint8_t psk[PSK_LEN])
{
    EVP_PKEY_CTX *k = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t len = PSK_LEN;
    int ok = k && EVP_PKEY_derive_init(k) > 0 && EVP_PKEY_CTX_set_hkdf_md(k, EVP_sha256()) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_salt(k, (const unsigned char *)PSK_SALT,
                                         (int)(sizeof(PSK_SALT) - 1)) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_key(k, secret, (int)TSP_WIRE_SECRET_LEN) > 0 &&
             EVP_PKEY_CTX_add1_hkdf_info(k, (const unsigned char *)label, (int)strlen(label)) > 0 &&
             EVP_PKEY_derive(k, psk, &len) > 0 && len == PSK_LEN;
    EVP_PKEY_CTX_free(k);
    return ok ? 0 : -EIO;
}

int tsp__tls_mac_hex(const uint8_t key[TSP__TLS_KEY_LEN], const void *p, size_t n, char out[65])
{
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned ml = 0;
    if (!HMAC(EVP_sha256(), key, (int)TSP__TLS_KEY_LEN, p, n, mac, &ml) || ml != 32)
        return -EIO;
    tsp__hex_encode(mac, ml, out);
    return 0;
}

/* A resumable-looking session that carries the external PSK (RFC 8446 4.2.11). */
static SSL_SESSION *psk_session(SSL *ssl, const tsp__tlsctx_t *x)
{
    const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, PSK_CIPHER);
    SSL_SESSION *sess = cipher ? SSL_SESSION_new() : NULL;
    if (sess && SSL_SESSION_set1_master_key(sess, x->psk, PSK_LEN) &&
        SSL_SESSION_set_cipher(sess, cipher) &&
        SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION))
        return sess;
    SSL_SESSION_free(sess);
    return NULL;
}

static int client_psk_cb(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                         SSL_SESSION **sessp)
{
    const tsp__tls_t *t = SSL_get_app_data(ssl);
    SSL_SESSION *sess = psk_session(ssl, t->x);
    if (!sess)
        return 0;
    /* After a HelloRetryRequest the suite is fixed: a PSK of another hash cannot be used. */
    if (md && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(sess))) {
        SSL_SESSION_free(sess);
        *sessp = NULL;
        *id = NULL;
        *idlen = 0;
        return 1;
    }
    *sessp = sess;
    *id = t->x->run_id;
    *idlen = TSP_WIRE_RUNID_LEN;
    return 1;
}

static int server_psk_cb(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sessp)
{
    tsp__tls_t *t = SSL_get_app_data(ssl);
    *sessp = NULL;
    if (idlen != TSP_WIRE_RUNID_LEN || CRYPTO_memcmp(id, t->x->run_id, idlen) != 0) {
        t->foreign = 1; /* no key for it: the handshake fails (a clear message below) */
        memcpy(t->foreign_id, id, idlen < TSP_WIRE_RUNID_LEN ? idlen : TSP_WIRE_RUNID_LEN);
        return 1;
    }
    *sessp = psk_session(ssl, t->x);
    return *sessp ? 1 : 0;
}

/* The modes a client's ALPN list offers (TSP__TLS_ENCRYPT, TSP__TLS_MAC). */
static int offered_modes(const unsigned char *in, unsigned inlen)
{
    int m = 0;
    for (unsigned i = 0; i < inlen && i + 1u + in[i] <= inlen; i += 1u + in[i]) {
        if (in[i] == sizeof(ALPN_ENC) - 1 && memcmp(in + i + 1, ALPN_ENC, in[i]) == 0)
            m |= TSP__TLS_ENCRYPT;
        if (in[i] == sizeof(ALPN_MAC) - 1 && memcmp(in + i + 1, ALPN_MAC, in[i]) == 0)
            m |= TSP__TLS_MAC;
    }
    return m;
}

/* The server picks the protocol of its setting, or refuses (no_application_protocol). */
static int alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned inlen, void *arg)
{
    (void)arg;
    tsp__tls_t *t = SSL_get_app_data(ssl);
    int want = atomic_load(&t->x->modes) & TSP__TLS_MAC ? TSP__TLS_MAC : TSP__TLS_ENCRYPT;
    int offer = offered_modes(in, inlen);
    if (!(offer & want)) {
        t->refused_modes = offer ? offer : -1;
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    }
    const char *p = want == TSP__TLS_MAC ? ALPN_MAC : ALPN_ENC;
    *out = (const unsigned char *)p;
    *outlen = (unsigned char)strlen(p);
    return SSL_TLSEXT_ERR_OK;
}

void tsp__tlsctx_set_modes(tsp__tlsctx_t *x, int modes)
{
    atomic_store(&x->modes, modes);
}

int tsp__tlsctx_new(tsp__tlsctx_t **out, int server, const uint8_t secret[TSP_WIRE_SECRET_LEN],
                    char *err, size_t errlen)
{
    return tsp__tlsctx_new_for(out, server, secret, TSP__TLS_LOG_LABEL, err, errlen);
}

int tsp__tlsctx_new_for(tsp__tlsctx_t **out, int server, const uint8_t secret[TSP_WIRE_SECRET_LEN],
                        const char *label, char *err, size_t errlen)
{
    tsp__tlsctx_t *x = calloc(1, sizeof(*x));
    if (!x)
        return tsp__err(err, errlen, -ENOMEM, "no memory for a TLS context");
    x->server = server;
    atomic_init(&x->modes, server ? TSP__TLS_ENCRYPT : TSP__TLS_ENCRYPT | TSP__TLS_MAC);
    x->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!x->ctx || tsp__tls_derive(secret, label, x->psk) || tsp_wire_run_id(secret, x->run_id) ||
        !SSL_CTX_set_min_proto_version(x->ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_max_proto_version(x->ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(x->ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256") ||
        !SSL_CTX_set_num_tickets(x->ctx, 0)) {
        tsp__tlsctx_free(x);
        return tsp__err(err, errlen, -EIO, "cannot set up TLS 1.3 (OpenSSL's libssl)");
    }
    /* No tickets, no early data, no resumption: one full PSK + (EC)DHE handshake each time.
     * Partial writes and a moving buffer: the callers' send buffers shift as they drain. */
    SSL_CTX_set_options(x->ctx, SSL_OP_NO_TICKET | SSL_OP_ENABLE_KTLS |
                                    SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(x->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                                 SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(x->ctx, SSL_SESS_CACHE_OFF);
    if (server) {
        SSL_CTX_set_psk_find_session_callback(x->ctx, server_psk_cb);
        SSL_CTX_set_alpn_select_cb(x->ctx, alpn_select_cb, NULL);
    } else {
        SSL_CTX_set_psk_use_session_callback(x->ctx, client_psk_cb);
    }
    *out = x;
    return 0;
}

void tsp__tlsctx_free(tsp__tlsctx_t *x)
{
    if (!x)
        return;
    SSL_CTX_free(x->ctx);
    OPENSSL_cleanse(x->psk, sizeof(x->psk));
    free(x);
}

int tsp__tls_new(tsp__tls_t **out, tsp__tlsctx_t *x, int fd)
{
    if (!x)
        return -EINVAL;
    tsp__tls_t *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->ssl = SSL_new(x->ctx);
    if (!t->ssl || !SSL_set_fd(t->ssl, fd)) {
        SSL_free(t->ssl);
        free(t);
        ERR_clear_error();
        return -ENOMEM;
    }
    t->x = x;
    t->fd = fd;
    SSL_set_app_data(t->ssl, t);
    int m = atomic_load(&x->modes);
    unsigned char alpn[2 + sizeof(ALPN_ENC) + sizeof(ALPN_MAC)];
    size_t al = 0;
    if (m & TSP__TLS_ENCRYPT) {
        alpn[al++] = (unsigned char)(sizeof(ALPN_ENC) - 1);
        memcpy(alpn + al, ALPN_ENC, sizeof(ALPN_ENC) - 1);
        al += sizeof(ALPN_ENC) - 1;
    }
    if (m & TSP__TLS_MAC) {
        alpn[al++] = (unsigned char)(sizeof(ALPN_MAC) - 1);
        memcpy(alpn + al, ALPN_MAC, sizeof(ALPN_MAC) - 1);
        al += sizeof(ALPN_MAC) - 1;
    }
    if (!x->server && SSL_set_alpn_protos(t->ssl, alpn, (unsigned)al) != 0) {
        SSL_free(t->ssl);
        free(t);
        ERR_clear_error();
        return -ENOMEM;
    }
    if (x->server)
        SSL_set_accept_state(t->ssl);
    else
        SSL_set_connect_state(t->ssl);
    *out = t;
    return 0;
}

void tsp__tls_free(tsp__tls_t *t)
{
    if (!t)
        return;
    SSL_free(t->ssl);
    tsp__macrec_free(t->mac);
    free(t);
}

int tsp__tls_dial(tsp__tls_t **out, int fd, const uint8_t secret[TSP_WIRE_SECRET_LEN], char *err,
                  size_t errlen)
{
    return tsp__tls_dial_for(out, fd, secret, TSP__TLS_LOG_LABEL, err, errlen);
}

int tsp__tls_dial_for(tsp__tls_t **out, int fd, const uint8_t secret[TSP_WIRE_SECRET_LEN],
                      const char *label, char *err, size_t errlen)
{
    tsp__tlsctx_t *x = NULL;
    int rc = tsp__tlsctx_new_for(&x, 0, secret, label, err, errlen);
    if (rc)
        return rc;
    if ((rc = tsp__tls_new(out, x, fd))) {
        tsp__tlsctx_free(x);
        return tsp__err(err, errlen, rc, "no memory for a TLS connection");
    }
    (*out)->own_ctx = 1;
    return 0;
}

void tsp__tls_close(tsp__tls_t *t)
{
    if (!t)
        return;
    int fd = t->fd;
    tsp__tlsctx_t *x = t->own_ctx ? t->x : NULL;
    tsp__tls_free(t);
    tsp__tlsctx_free(x);
    close(fd);
}

int tsp__tls_fd(const tsp__tls_t *t)
{
    return t->fd;
}

short tsp__tls_want(const tsp__tls_t *t)
{
    return t->want;
}

int tsp__tls_pending(const tsp__tls_t *t)
{
    if (t && t->mac)
        return tsp__macrec_pending(t->mac);
    return t && SSL_pending(t->ssl) > 0;
}

const char *tsp__tls_why(const tsp__tls_t *t)
{
    return t->why[0] ? t->why : "TLS failed";
}

/* OpenSSL writes to its socket with write(), not send(MSG_NOSIGNAL): a peer that is gone
 * would raise SIGPIPE and kill a process that keeps its default action (torchspark-run,
 * a JVM's native thread). Around each write, SIGPIPE is blocked in this thread, and one it
 * raised is taken back before the mask is restored. */
static void nopipe_begin(sigset_t *old)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, old);
}

static void nopipe_end(const sigset_t *old, int saved_errno)
{
    if (saved_errno == EPIPE && !sigismember(old, SIGPIPE)) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&s, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Maps the result r of an SSL call; fills why on failure. */
static int map_err(tsp__tls_t *t, int r, int saved_errno)
{
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        t->want = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return -EAGAIN;
    }
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(t->why, sizeof(t->why), "the peer closed the TLS connection");
        return 0;
    }
    unsigned long code = ERR_peek_last_error();
    if (e == SSL_ERROR_SYSCALL && code == 0) {
        ERR_clear_error();
        if (saved_errno == EINTR || saved_errno == EAGAIN) {
            t->want = POLLIN;
            return -EAGAIN;
        }
        snprintf(t->why, sizeof(t->why), "%s",
                 saved_errno ? strerror(saved_errno) : "the peer closed the connection");
        return saved_errno ? -saved_errno : 0;
    }
    char detail[160] = "unknown";
    if (code)
        ERR_error_string_n(code, detail, sizeof(detail));
    ERR_clear_error();
    int reason = ERR_GET_REASON(code);
    if (reason == SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC ||
        reason == SSL_R_SSLV3_ALERT_BAD_RECORD_MAC)
        snprintf(t->why, sizeof(t->why),
                 "a TLS record failed authentication: bytes were altered between agent and "
                 "driver (an on-path attacker or a faulty network device); nothing of it was "
                 "used (%s)",
                 detail);
    else
        snprintf(t->why, sizeof(t->why), "TLS failed (%s)", detail);
    return -EBADMSG;
}

/* Once both Finished messages are through: the protocol the server picked, and with encryption
 * off the record keys from the TLS exporter (docs/protocol.md 1.10.1). 0 or -EACCES / -EIO. */
static int after_handshake(tsp__tls_t *t)
{
    const unsigned char *p = NULL;
    unsigned n = 0;
    SSL_get0_alpn_selected(t->ssl, &p, &n);
    int mode = (n == sizeof(ALPN_MAC) - 1 && memcmp(p, ALPN_MAC, n) == 0)   ? TSP__TLS_MAC
               : (n == sizeof(ALPN_ENC) - 1 && memcmp(p, ALPN_ENC, n) == 0) ? TSP__TLS_ENCRYPT
                                                                            : 0;
    if (!mode) {
        snprintf(t->why, sizeof(t->why), "%s",
                 t->x->server ? "TLS handshake refused: the client offered no torchspark "
                                "protocol (ALPN torchspark/3 or torchspark/3+mac): it is not a "
                                "torchspark agent of version 3"
                              : "the driver chose no torchspark protocol (ALPN): it is not a "
                                "torchspark driver of version 3");
        return -EACCES;
    }
    if (mode == TSP__TLS_ENCRYPT || t->mac)
        return 0;
    uint8_t k[32], c2s[EVP_MAX_MD_SIZE], s2c[EVP_MAX_MD_SIZE];
    unsigned ml = 0;
    int rc = SSL_export_keying_material(t->ssl, k, sizeof(k), MAC_EXPORTER,
                                        sizeof(MAC_EXPORTER) - 1, NULL, 0, 0) == 1 &&
                     HMAC(EVP_sha256(), k, (int)sizeof(k),
                          (const unsigned char *)"client to server", 16, c2s, &ml) &&
                     HMAC(EVP_sha256(), k, (int)sizeof(k),
                          (const unsigned char *)"server to client", 16, s2c, &ml)
                 ? tsp__macrec_new(&t->mac, t->x->server ? s2c : c2s, t->x->server ? c2s : s2c)
                 : -EIO;
    OPENSSL_cleanse(k, sizeof(k));
    OPENSSL_cleanse(c2s, sizeof(c2s));
    OPENSSL_cleanse(s2c, sizeof(s2c));
    if (rc)
        snprintf(t->why, sizeof(t->why), "cannot set up the MAC'ed records (OpenSSL)");
    return rc;
}

/* The sentence of a handshake refused for the encryption setting (ALPN), or NULL. */
static const char *mode_refusal(const tsp__tls_t *t, unsigned long code)
{
    if (t->x->server && t->refused_modes == TSP__TLS_ENCRYPT)
        return "TLS handshake refused: the agent requires encryption on (it offers only ALPN "
               "torchspark/3) and this driver has spark.torchspark.encryption=false: set the "
               "same on both";
    if (t->x->server && t->refused_modes == TSP__TLS_MAC)
        return "TLS handshake refused: the agent requires encryption off (it offers only ALPN "
               "torchspark/3+mac) and this driver has spark.torchspark.encryption=true: set the "
               "same on both";
    if (t->x->server && t->refused_modes)
        return "TLS handshake refused: the client offered no torchspark protocol (ALPN "
               "torchspark/3 or torchspark/3+mac): it is not a torchspark agent of version 3";
    if (t->x->server || ERR_GET_REASON(code) != SSL_R_TLSV1_ALERT_NO_APPLICATION_PROTOCOL)
        return NULL;
    int m = atomic_load(&t->x->modes);
    if (m == TSP__TLS_ENCRYPT)
        return "the driver refused the TLS handshake: this driver has "
               "spark.torchspark.encryption=false and this agent requires encryption on: set "
               "the same on both";
    if (m == TSP__TLS_MAC)
        return "the driver refused the TLS handshake: this driver has "
               "spark.torchspark.encryption=true and this agent requires encryption off: set "
               "the same on both";
    return "the driver refused the TLS handshake: it speaks no torchspark protocol that this "
           "agent offers (ALPN)";
}

int tsp__tls_handshake(tsp__tls_t *t)
{
    ERR_clear_error();
    sigset_t old;
    nopipe_begin(&old);
    errno = 0;
    int r = SSL_do_handshake(t->ssl);
    int e = errno;
    nopipe_end(&old, e);
    if (r == 1)
        return after_handshake(t);
    unsigned long code = ERR_peek_last_error();
    int rc = map_err(t, r, e);
    if (rc == -EAGAIN)
        return rc;
    const char *refusal = mode_refusal(t, code);
    if (refusal) {
        snprintf(t->why, sizeof(t->why), "%s", refusal);
        return -EACCES;
    }
    char hex[2 * TSP_WIRE_RUNID_LEN + 1], own[2 * TSP_WIRE_RUNID_LEN + 1];
    if (t->foreign) {
        tsp__hex_encode(t->foreign_id, 8, hex);
        tsp__hex_encode(t->x->run_id, 8, own);
        snprintf(t->why, sizeof(t->why),
                 "TLS handshake refused: the client belongs to another run (run id %s..., this "
                 "run is %s...)",
                 hex, own);
        return -EACCES;
    }
    if (rc == 0)
        return -ECONNRESET;
    char d[WHY_LEN];
    snprintf(d, sizeof(d), "%s", t->why);
    if (t->x->server)
        snprintf(t->why, sizeof(t->why),
                 "TLS handshake refused: %s; the client does not know this run's key, or is "
                 "not a torchspark agent of version 3",
                 d);
    else
        snprintf(t->why, sizeof(t->why),
                 "the driver refused the TLS handshake (%s): it serves another run, or does "
                 "not know this run's secret",
                 d);
    return rc == -EBADMSG ? -EACCES : rc;
}

ssize_t tsp__tls_read(tsp__tls_t *t, void *buf, size_t n)
{
    if (t->mac)
        return tsp__macrec_read(t->mac, t->fd, buf, n, &t->want, t->why, sizeof(t->why));
    ERR_clear_error();
    errno = 0;
    size_t got = 0;
    sigset_t old;
    nopipe_begin(&old); /* a read may write: an alert, a key update */
    errno = 0;
    int r = SSL_read_ex(t->ssl, buf, n, &got);
    int e = errno;
    nopipe_end(&old, e);
    if (r == 1)
        return (ssize_t)got;
    return map_err(t, r, e);
}

ssize_t tsp__tls_write(tsp__tls_t *t, const void *buf, size_t n)
{
    if (t->mac)
        return tsp__macrec_write(t->mac, t->fd, buf, n, &t->want, t->why, sizeof(t->why));
    ERR_clear_error();
    errno = 0;
    size_t put = 0;
    sigset_t old;
    nopipe_begin(&old);
    errno = 0;
    int r = SSL_write_ex(t->ssl, buf, n, &put);
    int e = errno;
    nopipe_end(&old, e);
    if (r == 1)
        return (ssize_t)put;
    int rc = map_err(t, r, e);
    return rc == 0 ? -EPIPE : rc;
}

void tsp__tls_close_notify(tsp__tls_t *t)
{
    if (t->mac)
        return; /* the records end with the TCP stream (docs/protocol.md 1.10.1) */
    ERR_clear_error();
    sigset_t old;
    nopipe_begin(&old);
    errno = 0;
    (void)SSL_shutdown(t->ssl);
    nopipe_end(&old, errno);
    ERR_clear_error();
}

int tsp__tls_ktls_send(const tsp__tls_t *t)
{
    return !t->mac && BIO_get_ktls_send(SSL_get_wbio(t->ssl)) ? 1 : 0;
}

ssize_t tsp__tls_sendfile(tsp__tls_t *t, int filefd, off_t off, size_t n)
{
    if (!tsp__tls_ktls_send(t))
        return -ENOSYS;
    ERR_clear_error();
    sigset_t old;
    nopipe_begin(&old);
    errno = 0;
    ossl_ssize_t w = SSL_sendfile(t->ssl, filefd, off, n, 0);
    int e = errno;
    nopipe_end(&old, e);
    if (w >= 0)
        return (ssize_t)w;
    if (e == EAGAIN || e == EINTR) {
        t->want = POLLOUT;
        return -EAGAIN;
    }
    return e ? -e : -EIO;
}

int tsp__tls_handshake_by(tsp__tls_t *t, int64_t deadline, char *err, size_t errlen)
{
    for (;;) {
        int rc = tsp__tls_handshake(t);
        if (rc == 0)
            return 0;
        if (rc != -EAGAIN)
            return tsp__err(err, errlen, rc, "%s",
                            rc == -ECONNRESET ? "the driver closed the connection during the "
                                                "TLS handshake"
                                              : tsp__tls_why(t));
        if ((rc = tsp__wait_fd(t->fd, t->want, deadline)))
            return tsp__err(err, errlen, rc, "TLS handshake: %s",
                            rc == -ETIMEDOUT ? "no answer in time" : strerror(-rc));
    }
}

int tsp__tls_write_all(tsp__tls_t *t, const void *p, size_t n, int64_t deadline)
{
    const char *b = p;
    while (n > 0) {
        ssize_t w = tsp__tls_write(t, b, n);
        if (w > 0) {
            b += w;
            n -= (size_t)w;
            continue;
        }
        if (w != -EAGAIN)
            return (int)w;
        int rc = tsp__wait_fd(t->fd, t->want, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

int tsp__tls_read_full(tsp__tls_t *t, void *p, size_t n, int64_t deadline)
{
    char *b = p;
    while (n > 0) {
        ssize_t r = tsp__tls_read(t, b, n);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return -ECONNRESET;
        if (r != -EAGAIN)
            return (int)r;
        int rc = tsp__wait_fd(t->fd, t->want, deadline);
        if (rc)
            return rc;
    }
    return 0;
}
