/* env.h (internal): an environment block ("KEY=VALUE" strings) that can be edited and
 * handed to execve(). Used to build each worker's environment. */
#ifndef TSP_ENV_H
#define TSP_ENV_H

#include "torchspark/common.h"

typedef struct tsp_env {
    char **vars; /* NULL-terminated array of malloc'ed "KEY=VALUE" strings */
    size_t len;
    size_t cap;
} tsp_env_t;

/* Copies base (a NULL-terminated array such as environ; NULL for empty). */
int tsp_env_init(tsp_env_t *env, char *const *base);
/* Sets KEY to VALUE, replacing an existing entry. -EINVAL for an empty key or one with '='. */
int tsp_env_set(tsp_env_t *env, const char *key, const char *value);
/* Sets KEY only when it is not present. */
int tsp_env_set_default(tsp_env_t *env, const char *key, const char *value);
int tsp_env_unset(tsp_env_t *env, const char *key);
/* The value of KEY, or NULL. Valid until the next edit. */
const char *tsp_env_get(const tsp_env_t *env, const char *key);
/* Looks KEY up in a raw NULL-terminated environment array. */
const char *tsp_env_lookup(char *const *envp, const char *key);
void tsp_env_close(tsp_env_t *env);

#endif
