/* confvalue.h (internal): what conf.c and confvalue.c share: the key table's row type, a
 * request's reader with its values, and one value read against its key's grammar. The files:
 * conf.c (the key table, the request and the reply) and confvalue.c (the grammars: Spark's
 * booleans, whole numbers and durations; one value's reading, with the sentence for a bad
 * one). */
#ifndef TSP_CONFVALUE_H
#define TSP_CONFVALUE_H

#include <stddef.h>
#include <stdio.h>

#include "json.h"

#define NKEYS 19 /* the key table's rows (conf.c's KEYS, which asserts it) */
#define NSPARK 7 /* Spark's security keys (conf.c's SPARK_KEYS, which asserts it) */

typedef enum { T_BOOL, T_INT, T_DURATION, T_ENUM, T_STRING } type_t;

typedef struct {
    const char *key;
    type_t type;
    int unit_ms;       /* duration: milliseconds of a bare number */
    const char *dflt;  /* in the key's own grammar; NULL: unset, the reply says null */
    long long min;     /* int: the bounds; duration: the least milliseconds */
    long long max;     /* int only */
    const char *extra; /* enum: its values, '|' between; else an example of a good value */
    const char *doc;
    const char *env; /* the driver's environment variable that wins over the key, or NULL */
} conf_key_t;

typedef struct {
    int set;          /* a value (or the default) was read */
    long long num;    /* bool, int, duration (ms) */
    const char *word; /* enum (the table's spelling) */
    char *str;        /* string (malloc'ed) */
} val_t;

typedef struct {
    val_t vals[NKEYS];
    FILE *unknown; /* the reply's "unknown" members, written as they are met */
    tsp_json_writer_t uw;
    char *err;
    size_t errlen;
    int from_args; /* the member being read is an argument: its value may be typed */
    const char *name;
    const char *env_name; /* the value being read is this environment variable's */
    int spark_on[NSPARK]; /* Spark's security settings (SPARK_KEYS) that are "true" */
    int dynamic;          /* DYNAMIC_KEY is "true" */
    long long nodes;      /* the request's "run": its nodes (0: no "run") and GPUs */
    int gpu;
} reader_t;

/* s without surrounding white space, lower-cased, in buf; 0, or -EINVAL when too long. */
int tsp__conf_trim_lower(const char *s, char *buf, size_t len);
/* k's boolean from v (a JSON value of type) in out->num; 0, or -EINVAL with r's sentence. */
int tsp__conf_read_bool(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out);
/* k's whole number within its bounds from v in out->num; 0, or -EINVAL with r's sentence. */
int tsp__conf_read_int(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out);
/* k's duration from v in milliseconds in out->num; 0, or -EINVAL with r's sentence. */
int tsp__conf_read_duration(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out);
/* k's enum word from v in out->word (the table's spelling); 0, or -EINVAL with r's sentence. */
int tsp__conf_read_enum(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out);
/* k's non-empty string from v in out->str (malloc'ed); 0, -ENOMEM, or -EINVAL with r's
 * sentence. */
int tsp__conf_read_string(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out);

#endif
