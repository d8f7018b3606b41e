/* logclientq.c: the log client's queue (logclientq.h): a line or an event encoded into
 * frames in the tail block, under the client's mutex, never blocking the writer (full:
 * -EAGAIN and a wake-up later, or a drop counted per rank); reports offered to the fold
 * first (agentfold.h); blocks freed once sent and acknowledged; events held for the first
 * handshake. */
#include "logclientq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

void tsp__logclient_notify(int fd)
{
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof(one));
    (void)w; /* a saturated eventfd is still readable */
}

void tsp__logclient_drain_fd(int fd)
{
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof(v));
    (void)r; /* EAGAIN when already reset */
}

/* ---- the queue (under mu) ----------------------------------------------------------- */

/* Makes room for need bytes in the tail block (a new block when it has too little), so
 * that the frames of one line always land together: a line is queued whole or not at all. */
int tsp__logclient_reserve(tsp_logclient_t *c, size_t need)
{
    blk_t *b = c->tail;
    if (b && b->cap - b->len >= need)
        return 0;
    size_t cap = need > BLK_SIZE ? need : BLK_SIZE;
    b = malloc(sizeof(*b) + cap);
    if (!b)
        return -ENOMEM;
    *b = (blk_t){.base = c->appended, .cap = cap, .last_seq = c->seq};
    if (c->tail)
        c->tail->next = b;
    else
        c->head = b;
    c->tail = b;
    return 0;
}

/* Appends a frame into room made by tsp__logclient_reserve(). */
void tsp__logclient_append_frame(tsp_logclient_t *c, const tsp_wire_hdr_t *h, const void *extra,
                                 size_t elen, const void *data, size_t dlen)
{
    size_t need = TSP_WIRE_HDR_LEN + elen + dlen;
    blk_t *b = c->tail;
    tsp_wire_hdr_pack((uint8_t *)b->data + b->len, h);
    memcpy(b->data + b->len + TSP_WIRE_HDR_LEN, extra, elen);
    if (dlen) /* an empty line may come with data == NULL */
        memcpy(b->data + b->len + TSP_WIRE_HDR_LEN + elen, data, dlen);
    b->len += need;
    b->last_seq = c->seq;
    c->appended += need;
    c->bytes += need;
}

static void count_drop(tsp_logclient_t *c, int32_t rank)
{
    for (size_t i = 0; i < c->ndrops; i++)
        if (c->drops[i].rank == rank) {
            c->drops[i].count++;
            goto counted;
        }
    drop_rec_t *nd = realloc(c->drops, (c->ndrops + 1) * sizeof(*nd));
    if (!nd)
        return;
    c->drops = nd;
    c->drops[c->ndrops++] = (drop_rec_t){.rank = rank, .count = 1};
counted:
    c->drops_dirty = 1;
    c->st.dropped++;
}

/* Queues one line; never blocks (see lines.h). quiet: the sender's own (a summary due,
 * agentfold.h), which on a full queue only says -EAGAIN and retries at its next tick. */
static int append_line(tsp_logclient_t *c, const tsp_line_t *line, int quiet)
{
    size_t pieces = line->len ? (line->len + TSP_WIRE_MAX_LINE - 1) / TSP_WIRE_MAX_LINE : 1;
    size_t need = line->len + pieces * FRAME_OVERHEAD;
    pthread_mutex_lock(&c->mu);
    if (quiet && c->bytes > 0 && c->bytes + need > c->o.mem_bytes) {
        pthread_mutex_unlock(&c->mu);
        return -EAGAIN;
    }
    if (c->bytes > 0 && c->bytes + need > c->o.mem_bytes) {
        if (c->o.drop) {
            count_drop(c, line->rank);
            pthread_mutex_unlock(&c->mu);
            tsp__logclient_notify(c->notify_fd);
            return 0;
        }
        /* Reset wake_fd under the lock: the sender sets it (under the lock) only after
         * this point, when room appears, so the agent cannot miss the wake-up. */
        tsp__logclient_drain_fd(c->sink.wake_fd);
        if (!c->want_wake)
            c->blocked_at = tsp__now_ms();
        c->want_wake = 1;
        pthread_mutex_unlock(&c->mu);
        /* in fallback the sender spills at once, not at its next tick */
        tsp__logclient_notify(c->notify_fd);
        return -EAGAIN;
    }
    if (tsp__logclient_reserve(c, need)) {
        /* No memory now. Wake the agent again when the sender frees some, or at once when
         * nothing is queued (nothing would be freed): a paused stream must never wait for
         * a wake-up that cannot come. */
        if (c->bytes) {
            if (!c->want_wake)
                c->blocked_at = tsp__now_ms();
            c->want_wake = 1;
        } else
            tsp__logclient_notify(c->sink.wake_fd);
        pthread_mutex_unlock(&c->mu);
        return -EAGAIN;
    }
    for (size_t i = 0, off = 0; i < pieces; i++) {
        size_t n = line->len - off < TSP_WIRE_MAX_LINE ? line->len - off : TSP_WIRE_MAX_LINE;
        int last = i + 1 == pieces;
        uint8_t seq[8];
        tsp_wire_put_u64(seq, ++c->seq);
        tsp_wire_hdr_t h = {.type = TSP_WIRE_LINE,
                            .rank = line->rank,
                            .stream = line->stream,
                            .flags = (uint8_t)(last ? line->flags : TSP_LINE_CONTINUED),
                            .length = (uint32_t)(8 + n)};
        tsp__logclient_append_frame(c, &h, seq, 8, line->data + off, n);
        off += n;
    }
    c->st.lines++;
    int wake = c->sender_idle;
    c->sender_idle = 0;
    pthread_mutex_unlock(&c->mu);
    if (wake)
        tsp__logclient_notify(c->notify_fd);
    return 0;
}

static int put_writer(void *ctx, const tsp_line_t *line)
{
    return append_line(ctx, line, 0);
}

int tsp__logclient_put_sender(void *ctx, const tsp_line_t *line)
{
    return append_line(ctx, line, 1);
}

/* A report was folded and is held (no frame queued): the sender must tick within
 * FOLD_TICK_MS to hand it on when it is due. A sender that found nothing held at its last
 * tick waits up to a second; it is woken (once) to tick again. */
static void fold_held(tsp_logclient_t *c)
{
    pthread_mutex_lock(&c->mu);
    int wake = !c->fold_ticking;
    c->fold_new = 1;
    pthread_mutex_unlock(&c->mu);
    if (wake)
        tsp__logclient_notify(c->notify_fd);
}

/* The sink's write_line: never blocks (see lines.h). */
int tsp__logclient_write_line(void *ctx, const tsp_line_t *line)
{
    tsp_logclient_t *c = ctx;
    if (line->rank < 0 || line->rank > TSP_WIRE_MAX_RANK ||
        (line->stream != TSP_STREAM_STDOUT && line->stream != TSP_STREAM_STDERR &&
         line->stream != TSP_STREAM_REPORT))
        return -EINVAL;
    if (c->fold && line->stream == TSP_STREAM_REPORT) {
        int rc = tsp__afold_offer(c->fold, line, tsp__now_ms(), put_writer, c);
        if (rc == 0 && tsp__afold_pending(c->fold))
            fold_held(c);
        return rc;
    }
    return append_line(c, line, 0);
}

/* Frees blocks that are wholly sent and acknowledged; wakes the agent when room appeared. */
void tsp__logclient_release_locked(tsp_logclient_t *c)
{
    while (c->head && c->head->base + c->head->len <= c->sent && c->head->last_seq <= c->acked) {
        blk_t *b = c->head;
        c->head = b->next;
        if (!c->head)
            c->tail = NULL;
        c->bytes -= b->len;
        free(b);
    }
    if (c->want_wake && c->bytes + 2 * (TSP_WIRE_MAX_LINE + FRAME_OVERHEAD) <= c->o.mem_bytes) {
        c->want_wake = 0;
        tsp__logclient_notify(c->sink.wake_fd);
    }
}

/* Appends an EVENT frame behind what is queued, numbered in the lines' sequence. */
int tsp__logclient_append_event_locked(tsp_logclient_t *c, int kind, int32_t rank, const char *json,
                                       size_t len)
{
    uint8_t extra[9];
    tsp_wire_put_u64(extra, c->seq + 1);
    extra[8] = (uint8_t)kind;
    tsp_wire_hdr_t h = {
        .type = TSP_WIRE_EVENT, .rank = rank, .length = (uint32_t)(sizeof(extra) + len)};
    int rc = tsp__logclient_reserve(c, TSP_WIRE_HDR_LEN + sizeof(extra) + len);
    if (rc)
        return rc;
    c->seq++;
    tsp__logclient_append_frame(c, &h, extra, sizeof(extra), json, len);
    return 0;
}

/* Keeps an event that came before the first handshake (whether the driver takes events is
 * not known yet); flush_early_locked sends or discards it once a handshake has told. */
int tsp__logclient_hold_early_locked(tsp_logclient_t *c, int kind, int32_t rank, const char *json,
                                     size_t len)
{
    early_ev_t *e = malloc(sizeof(*e) + len);
    if (!e)
        return -ENOMEM;
    *e = (early_ev_t){.kind = kind, .rank = rank, .len = len};
    if (len)
        memcpy(e->json, json, len);
    *c->early_tail = e;
    c->early_tail = &e->next;
    return 0;
}

/* After a handshake (control >= 0): the held events enter the queue, in the order they
 * came, behind the lines queued so far (CONTROL granted), or are discarded (refused: such
 * a driver takes no EVENT frame). Without memory now, the rest wait for the next send. */
void tsp__logclient_flush_early_locked(tsp_logclient_t *c)
{
    while (c->early && c->control >= 0) {
        early_ev_t *e = c->early;
        if (c->control == 1 &&
            tsp__logclient_append_event_locked(c, e->kind, e->rank, e->json, e->len))
            return;
        if (c->control == 0)
            c->st.events_unsent++;
        c->early = e->next;
        if (!c->early)
            c->early_tail = &c->early;
        free(e);
    }
}

void tsp__logclient_free_early_locked(tsp_logclient_t *c)
{
    for (early_ev_t *e = c->early, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    c->early = NULL;
    c->early_tail = &c->early;
}
