/* env.c: an editable environment block for execve(). */
#include "env.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int env_grow(tsp_env_t *env)
{
    if (env->len + 1 < env->cap)
        return 0;
    size_t ncap = env->cap ? env->cap * 2 : 64;
    char **nv = realloc(env->vars, ncap * sizeof(*nv));
    if (!nv)
        return -ENOMEM;
    env->vars = nv;
    env->cap = ncap;
    return 0;
}

static ptrdiff_t env_find(char *const *vars, size_t len, const char *key, size_t klen)
{
    for (size_t i = 0; i < len; i++)
        if (strncmp(vars[i], key, klen) == 0 && vars[i][klen] == '=')
            return (ptrdiff_t)i;
    return -1;
}

int tsp_env_init(tsp_env_t *env, char *const *base)
{
    memset(env, 0, sizeof(*env));
    int rc = env_grow(env);
    if (rc)
        return rc;
    env->vars[0] = NULL;
    for (size_t i = 0; base && base[i]; i++) {
        const char *eq = strchr(base[i], '=');
        if (!eq || eq == base[i])
            continue; /* not a KEY=VALUE entry: execve would pass it, we drop it */
        if ((rc = env_grow(env)) != 0)
            goto fail;
        if (!(env->vars[env->len] = strdup(base[i]))) {
            rc = -ENOMEM;
            goto fail;
        }
        env->vars[++env->len] = NULL;
    }
    return 0;
fail:
    tsp_env_close(env);
    return rc;
}

int tsp_env_set(tsp_env_t *env, const char *key, const char *value)
{
    size_t klen = strlen(key), vlen = strlen(value);
    if (klen == 0 || strchr(key, '='))
        return -EINVAL;
    char *kv = malloc(klen + vlen + 2);
    if (!kv)
        return -ENOMEM;
    memcpy(kv, key, klen); // NOLINT(bugprone-not-null-terminated-result): "=value\0" follows
    kv[klen] = '=';
    memcpy(kv + klen + 1, value, vlen + 1);
    ptrdiff_t at = env_find(env->vars, env->len, key, klen);
    if (at >= 0) {
        free(env->vars[at]);
        env->vars[at] = kv;
        return 0;
    }
    int rc = env_grow(env);
    if (rc) {
        free(kv);
        return rc;
    }
    env->vars[env->len++] = kv;
    env->vars[env->len] = NULL;
    return 0;
}

int tsp_env_set_default(tsp_env_t *env, const char *key, const char *value)
{
    return tsp_env_get(env, key) ? 0 : tsp_env_set(env, key, value);
}

int tsp_env_unset(tsp_env_t *env, const char *key)
{
    ptrdiff_t at = env_find(env->vars, env->len, key, strlen(key));
    if (at < 0)
        return 0;
    free(env->vars[at]);
    memmove(&env->vars[at], &env->vars[at + 1], (env->len - (size_t)at) * sizeof(char *));
    env->len--;
    return 0;
}

const char *tsp_env_get(const tsp_env_t *env, const char *key)
{
    return tsp_env_lookup(env->vars, key);
}

const char *tsp_env_lookup(char *const *envp, const char *key)
{
    size_t klen = strlen(key);
    for (size_t i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], key, klen) == 0 && envp[i][klen] == '=')
            return envp[i] + klen + 1;
    return NULL;
}

void tsp_env_close(tsp_env_t *env)
{
    for (size_t i = 0; i < env->len; i++)
        free(env->vars[i]);
    free(env->vars);
    memset(env, 0, sizeof(*env));
}
