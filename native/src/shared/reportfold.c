/* reportfold.c: one rank's report summary (reportfold.h; docs/protocol.md 1.8). */
#include "reportfold.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static void write_num(tsp_json_writer_t *w, double v)
{
    char b[40];
    int n = snprintf(b, sizeof b, "%.17g", v);
    tsp_json_value(w, b, (size_t)n);
}

static void write_metric_map(tsp_json_writer_t *w, const char *key, const tsp__rfold_metric_t *m,
                             size_t nm, int what)
{
    tsp_json_key(w, key);
    tsp_json_begin_object(w);
    for (size_t i = 0; i < nm; i++) {
        tsp_json_key(w, m[i].name);
        write_num(w, what == 0   ? m[i].last
                     : what == 1 ? m[i].min
                     : what == 2 ? m[i].max
                                 : m[i].sum / (double)m[i].n);
    }
    tsp_json_end(w);
}

int tsp__rfold_take(tsp__rfold_t *s, char **out, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return -ENOMEM;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "step");
    tsp_json_value(&w, s->step, strlen(s->step));
    tsp_json_key(&w, "time");
    write_num(&w, s->last_time);
    write_metric_map(&w, "metrics", s->m, s->nm, 0);
    if (s->count > 1) {
        tsp_json_key(&w, "summary");
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "count");
        tsp_json_int(&w, (long long)s->count);
        tsp_json_key(&w, "first_time");
        write_num(&w, s->first_time);
        write_metric_map(&w, "min", s->m, s->nm, 1);
        write_metric_map(&w, "max", s->m, s->nm, 2);
        write_metric_map(&w, "mean", s->m, s->nm, 3);
        tsp_json_end(&w);
    }
    tsp_json_end(&w);
    if (fclose(f) != 0) {
        free(buf);
        return -ENOMEM;
    }
    s->count = 0;
    s->nm = 0;
    *out = buf;
    *len = n;
    return 0;
}

static int metric_cb(void *ctx, const char *key, size_t index, int type, const char *val,
                     size_t len)
{
    (void)index;
    tsp__rfold_rec_t *p = ctx;
    char num[64];
    if (type != TSP_JSON_NUMBER || !key || strlen(key) >= TSP_RFOLD_NAME_MAX ||
        p->nm == TSP_RFOLD_MAX_METRICS || len >= sizeof num)
        return p->bad = 1;
    memcpy(num, val, len);
    num[len] = 0;
    tsp__rfold_metric_t *m = &p->m[p->nm++];
    snprintf(m->name, sizeof m->name, "%s", key);
    m->last = strtod(num, NULL);
    return 0;
}

static int top_cb(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)index;
    tsp__rfold_rec_t *p = ctx;
    if (key && !strcmp(key, "step") && len < sizeof p->step &&
        (type == TSP_JSON_NUMBER || type == TSP_JSON_LITERAL)) {
        memcpy(p->step, val, len);
        p->step[len] = 0;
    } else if (key && !strcmp(key, "time") && type == TSP_JSON_NUMBER && len < 64) {
        char num[64];
        memcpy(num, val, len);
        num[len] = 0;
        p->time = strtod(num, NULL);
        p->has_time = 1;
    } else if (key && !strcmp(key, "metrics") && type == TSP_JSON_OBJECT) {
        if (tsp_json_each(val, len, NULL, metric_cb, p) != 0)
            p->bad = 1;
    } else {
        p->bad = 1; /* params, a summary, or anything unknown: passed as it is */
    }
    return p->bad;
}

int tsp__rfold_parse(const char *data, size_t len, tsp__rfold_rec_t *p)
{
    p->step[0] = 0;
    p->has_time = p->bad = 0;
    p->nm = 0;
    if (tsp_json_each(data, len, NULL, top_cb, p) != 0 || p->bad || !p->has_time || !p->step[0])
        return -EINVAL;
    return 0;
}

int tsp__rfold_add(tsp__rfold_t *s, const tsp__rfold_rec_t *p)
{
    if (!s->count)
        s->first_time = p->time;
    s->count++;
    s->last_time = p->time;
    memcpy(s->step, p->step, sizeof s->step);
    for (size_t i = 0; i < p->nm; i++) {
        tsp__rfold_metric_t *m = NULL;
        for (size_t k = 0; k < s->nm && !m; k++)
            if (!strcmp(s->m[k].name, p->m[i].name))
                m = &s->m[k];
        if (!m) {
            if (!s->m && !(s->m = calloc(TSP_RFOLD_MAX_METRICS, sizeof *s->m)))
                return -ENOMEM;
            if (s->nm == TSP_RFOLD_MAX_METRICS)
                continue; /* more names over the interval than a record may hold */
            m = &s->m[s->nm++];
            *m = p->m[i];
            m->min = m->max = m->sum = m->last;
            m->n = 1;
            continue;
        }
        double v = p->m[i].last;
        m->last = v;
        m->min = v < m->min ? v : m->min;
        m->max = v > m->max ? v : m->max;
        m->sum += v;
        m->n++;
    }
    return 0;
}

void tsp__rfold_free(tsp__rfold_t *s)
{
    free(s->m);
    s->m = NULL;
    s->nm = 0;
    s->count = 0;
}

void tsp__rfold_refill(double *tokens, int64_t *refill_ms, double rate, double burst_s, int64_t now)
{
    double cap = rate * burst_s > 1 ? rate * burst_s : 1;
    *tokens = *tokens < 0 ? cap : *tokens + rate * (double)(now - *refill_ms) / 1000.0;
    if (*tokens > cap)
        *tokens = cap;
    *refill_ms = now;
}
