/* util.h (internal): the small helpers every module of native/src shares, each written
 * once: the monotonic clock and deadlines, strict integer parsing, an error sentence into
 * a caller's buffer, hex, random bytes, a held TCP port, and HOST:PORT endpoints.
 *
 * util.c depends on nothing else of ours, so any file may include this header without
 * making a cycle (tests/check_includes.py keeps it so). */
#ifndef TSP_UTIL_H
#define TSP_UTIL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

/* ---- time --------------------------------------------------------------------------- */

/* Milliseconds on the monotonic clock (for deadlines and timeouts, never for dates). */
int64_t tsp__now_ms(void);
/* Seconds on the monotonic clock, to the nanosecond (for timing short operations; one
 * clock for every process of the host, so times from two processes compare). */
double tsp__now_s(void);
/* The absolute monotonic time timeout_ms ahead, for pthread_cond_timedwait on a
 * condition variable made by tsp__cond_init_mono. */
void tsp__deadline_in(struct timespec *ts, int timeout_ms);
/* A condition variable whose timed waits use the monotonic clock. 0 or -errno. */
int tsp__cond_init_mono(pthread_cond_t *cv);

/* ---- parsing ------------------------------------------------------------------------ */

/* Parses a whole non-negative decimal int ("12"): no sign, no space, nothing after it.
 * 0; -EINVAL otherwise; -ERANGE past INT_MAX. */
int tsp__parse_int(const char *s, int *out);

/* Splits "HOST:PORT", "[V6]:PORT" or "V6:ADDR:PORT" (the last colon separates the port)
 * into host (NUL-terminated, hostlen bytes) and port (1..65535). Without a port part,
 * ("HOST", "[V6]") *port is default_port, or -EINVAL when default_port < 0. -EINVAL for an
 * empty or too long host, an unclosed '[', or a port that is not a whole number in range. */
int tsp__endpoint_parse(const char *ep, char *host, size_t hostlen, int *port, int default_port);

/* ---- error text --------------------------------------------------------------------- */

/* Writes a sentence into err (when err is not NULL and errlen > 0) and returns code, so
 * that a failure is one line: `return tsp__err(err, errlen, -EIO, "...", ...);`. */
__attribute__((format(printf, 4, 5))) int tsp__err(char *err, size_t errlen, int code,
                                                   const char *fmt, ...);

/* Writes one diagnostic line, prefix + formatted text + '\n', to fd with a single write()
 * (so that lines from several processes sharing fd never interleave), at most 2 KiB, cut
 * to fit; EINTR is retried, other errors are ignored (a diagnostic has nowhere else to go). */
__attribute__((format(printf, 3, 0))) void tsp__log_linev(int fd, const char *prefix,
                                                          const char *fmt, va_list ap);

/* Appends a formatted sentence to the NUL-terminated text in buf (len bytes in all): never
 * overflows, always terminated; a full buffer keeps what it holds. */
__attribute__((format(printf, 3, 4))) void tsp__err_append(char *buf, size_t len, const char *fmt,
                                                           ...);

/* A JSON transform's reply (plan.h, failure.h, outcome.h, conf.h, hang.h): text (len bytes and a
 * NUL) copied to out when it fits; *needed (when given) is len + 1. 0, or -ENOSPC when outlen is
 * too small. */
int tsp__reply_copy(const char *text, size_t len, char *out, size_t outlen, size_t *needed);

/* The Levenshtein distance of a and b, case-insensitive (ASCII); INT_MAX when either has
 * TSP__EDIT_MAX bytes or more. */
#define TSP__EDIT_MAX 128
int tsp__edit_distance(const char *a, const char *b);

/* ---- bytes -------------------------------------------------------------------------- */

/* n bytes -> 2n lowercase hex digits and a NUL (out holds 2n + 1 bytes). */
void tsp__hex_encode(const void *in, size_t n, char *out);
/* Exactly 2n hex digits (either case, nothing else) -> n bytes. 0 or -EINVAL. */
int tsp__hex_decode(const char *hex, void *out, size_t n);
/* n bytes from the kernel's CSPRNG (getrandom(2), blocking until it is seeded; no weaker
 * fallback). 0 or -errno. */
int tsp__random_bytes(void *out, size_t n);

/* ---- sockets ------------------------------------------------------------------------ */

/* Waits until fd is ready for events (POLLIN / POLLOUT) or deadline (ms on the monotonic
 * clock, -1: none) passed. 0, -ETIMEDOUT or -errno. */
int tsp__wait_fd(int fd, short events, int64_t deadline);
/* Parses a numeric IPv4 or IPv6 address (no name lookup) with port into ss. 0 or -EINVAL. */
int tsp__addr_parse(const char *addr, int port, struct sockaddr_storage *ss, socklen_t *sslen);
/* Holds a TCP port: a socket bound to addr (numeric; NULL or "" is the IPv4 wildcard) and
 * port (0: the kernel picks one) with SO_REUSEADDR, close-on-exec, never listening, so
 * that torch's TCPStore (which sets SO_REUSEADDR too) can bind and listen on it while
 * nothing else can. *fd and *got_port receive the socket and the port. 0, or -errno with
 * a sentence in err. */
int tsp__port_reserve(const char *addr, int port, int *fd, int *got_port, char *err, size_t errlen);
/* The same with SO_REUSEPORT as well when reuseport is set: for a port that a program
 * binds with only SO_REUSEPORT (older NCCL ORed both option numbers into one setsockopt,
 * so only SO_REUSEPORT took effect). */
int tsp__port_reserve_ex(const char *addr, int port, int reuseport, int *fd, int *got_port,
                         char *err, size_t errlen);

#endif
