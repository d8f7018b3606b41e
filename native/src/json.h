/* json.h (internal): just enough JSON for torchelastic error files: look up a value by a
 * dotted path, and write strings escaped. Not a general JSON library. */
#ifndef TSP_JSON_H
#define TSP_JSON_H

#include <stdio.h>
#include "torchspark/common.h"

enum { TSP_JSON_STRING = 1, TSP_JSON_NUMBER, TSP_JSON_OBJECT, TSP_JSON_ARRAY, TSP_JSON_LITERAL };

/* Finds the value at path ("message.extraInfo.timestamp": object keys separated by '.').
 * On success *out is a malloc'ed NUL-terminated copy (strings unescaped, other values as
 * their JSON text) and *type a TSP_JSON_* kind. -ENOENT when absent, -EINVAL when the
 * document is malformed, -ENOMEM. */
int tsp_json_get(const char *doc, size_t len, const char *path, char **out, int *type);

/* 0 when doc is one well-formed JSON object with nothing after it but white space;
 * -EINVAL otherwise. */
int tsp_json_check_object(const char *doc, size_t len);

/* Writes s as a JSON string literal (with quotes); invalid UTF-8 bytes become U+FFFD. */
void tsp_json_write_string(FILE *f, const char *s);

#endif
