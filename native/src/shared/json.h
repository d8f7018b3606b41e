/* json.h (internal): the JSON that torchspark reads (torchelastic error files, election
 * records, the agent's reports) and the one writer every JSON document in native/ goes
 * through, with the reply object that the C entry points copy out. Not a general JSON
 * library: the reader validates a whole document and looks a value up by a dotted path.
 *
 * The reader is strict RFC 8259 (docs/protocol.md, "JSON"): exactly one value with only
 * white space (space, tab, CR, LF) around it; numbers as -?(0|[1-9][0-9]*)(.[0-9]+)?
 * ([eE][+-]?[0-9]+)?; the literals true, false, null; strings of valid UTF-8 with no raw
 * control character and only the escapes \" \\ \/ \b \f \n \r \t \uXXXX; containers nested
 * at most TSP_JSON_MAX_DEPTH deep. One choice of ours: a \u escape of a lone surrogate
 * (which Python's json.dump writes for text it decoded with surrogateescape) is accepted
 * and decodes to U+FFFD, so such a traceback is kept rather than refused. Duplicate keys
 * are accepted; a lookup finds the last, as Python's json does.
 */
#ifndef TSP_JSON_H
#define TSP_JSON_H

#include <stdio.h>
#include "torchspark/common.h"

enum { TSP_JSON_STRING = 1, TSP_JSON_NUMBER, TSP_JSON_OBJECT, TSP_JSON_ARRAY, TSP_JSON_LITERAL };

#define TSP_JSON_MAX_DEPTH 64 /* nesting of objects and arrays the reader accepts */

/* 0 when doc is exactly one well-formed JSON value (see above); -EINVAL otherwise. */
int tsp_json_check(const char *doc, size_t len);
/* 0 when doc is well formed and its value is an object; -EINVAL otherwise. */
int tsp_json_check_object(const char *doc, size_t len);

/* Finds the value at path ("message.extraInfo.timestamp": object keys separated by '.')
 * in a well-formed document. On success *out is a malloc'ed NUL-terminated copy (strings
 * decoded, up to a decoded U+0000; other values as their JSON text) and *type a TSP_JSON_*
 * kind. -ENOENT when absent, -EINVAL when the document is malformed, -ENOMEM. */
int tsp_json_get(const char *doc, size_t len, const char *path, char **out, int *type);

/* Calls fn for each element of the array, or each member of the object, at path (NULL
 * or "": the document itself), in order: key is the member's name (NULL for an array's
 * element), a string value decoded (NUL-terminated, its length without the NUL; valid
 * for the call only), any other value as its JSON text (not NUL-terminated). Linear in
 * the document: one validation pass, one walk. 0; -ENOENT when path is absent; -EINVAL
 * when the document is malformed or the value is neither array nor object; -ENOMEM; or
 * fn's non-zero return, which stops the walk. */
typedef int (*tsp_json_each_fn)(void *ctx, const char *key, size_t index, int type, const char *val,
                                size_t len);
int tsp_json_each(const char *doc, size_t len, const char *path, tsp_json_each_fn fn, void *ctx);

/* Writes doc's value in canonical form: the writer's separators (", " and ": ", as Python's
 * json.dumps) and no other white space, strings re-escaped by the writer
 * below, numbers and members as they are. 0, or -EINVAL (nothing written) when doc is
 * malformed. */
int tsp_json_canonical(const char *doc, size_t len, FILE *out);

/* Writes s as a JSON string literal (with quotes); invalid UTF-8 bytes become U+FFFD. */
void tsp_json_write_string(FILE *f, const char *s);

/* The writer: builds a document member by member, placing commas and colons itself.
 *   tsp_json_writer_t w; tsp_json_writer_init(&w, f);
 *   tsp_json_begin_object(&w); tsp_json_key(&w, "rank"); tsp_json_int(&w, 3);
 *   tsp_json_end(&w);
 * Separators as Python's json.dumps writes them (", " and ": "). Nesting deeper than
 * TSP_JSON_MAX_DEPTH is not tracked (such a document would not be read back). */
typedef struct tsp_json_writer {
    FILE *f;
    int depth;
    int after_key;
    unsigned char count[TSP_JSON_MAX_DEPTH + 1]; /* 1 once a level holds a value */
    unsigned char kind[TSP_JSON_MAX_DEPTH + 1];  /* '{' or '[' */
} tsp_json_writer_t;

void tsp_json_writer_init(tsp_json_writer_t *w, FILE *f);
void tsp_json_begin_object(tsp_json_writer_t *w);
void tsp_json_begin_array(tsp_json_writer_t *w);
/* Ends the innermost object or array. */
void tsp_json_end(tsp_json_writer_t *w);
void tsp_json_key(tsp_json_writer_t *w, const char *key);
/* A string value; NULL writes null. */
void tsp_json_str(tsp_json_writer_t *w, const char *s);
void tsp_json_int(tsp_json_writer_t *w, long long v);
/* A number with the given digits after the point ("%.*f"). */
void tsp_json_fixed(tsp_json_writer_t *w, double v, int digits);
void tsp_json_null(tsp_json_writer_t *w);
/* A value given as JSON text, re-emitted canonically when well formed; -EINVAL (nothing
 * written) when not, so that a caller can fall back to quoting it as a string. */
int tsp_json_value(tsp_json_writer_t *w, const char *json, size_t len);
/* A value this process wrote itself as JSON, as it is: no check and no re-emission, for a
 * document too large to read twice (the hang doctor's reply inside its event). */
void tsp_json_raw(tsp_json_writer_t *w, const char *json, size_t len);

/* The reply of a C entry point's JSON call being written: w holds the reply object open on
 * a memstream, which tsp_json_reply_close copies into the caller's out. */
typedef struct {
    FILE *f;
    char *doc;
    size_t len;
    tsp_json_writer_t w;
} tsp_json_reply_t;

/* Opens rp's reply object: 0, or -ENOMEM (rp then closes as nothing). */
int tsp_json_reply_open(tsp_json_reply_t *rp);

/* Ends rp's object, closes and frees it; when rc is 0 copies the reply into out as every JSON
 * call's (-ENOSPC with *needed). rc, or -ENOMEM, -ENOSPC. */
int tsp_json_reply_close(tsp_json_reply_t *rp, int rc, char *out, size_t outlen, size_t *needed);

#endif
