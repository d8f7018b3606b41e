/* torchspark/env.h: an environment block ("KEY=VALUE" strings) that can be edited and
 * handed to execve(). Used to build each worker's environment. */
#ifndef TORCHSPARK_ENV_H
#define TORCHSPARK_ENV_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsp_env {
    char **vars; /* NULL-terminated array of malloc'ed "KEY=VALUE" strings */
    size_t len;
    size_t cap;
} tsp_env_t;

/* Copies base (a NULL-terminated array such as environ; NULL for empty). */
TSP_EXTERN int tsp_env_init(tsp_env_t *env, char *const *base);
/* Sets KEY to VALUE, replacing an existing entry. -EINVAL for an empty key or one with '='. */
TSP_EXTERN int tsp_env_set(tsp_env_t *env, const char *key, const char *value);
/* Sets KEY only when it is not present. */
TSP_EXTERN int tsp_env_set_default(tsp_env_t *env, const char *key, const char *value);
TSP_EXTERN int tsp_env_unset(tsp_env_t *env, const char *key);
/* The value of KEY, or NULL. Valid until the next edit. */
TSP_EXTERN const char *tsp_env_get(const tsp_env_t *env, const char *key);
/* Looks KEY up in a raw NULL-terminated environment array. */
TSP_EXTERN const char *tsp_env_lookup(char *const *envp, const char *key);
TSP_EXTERN void tsp_env_close(tsp_env_t *env);

#ifdef __cplusplus
}
#endif
#endif
