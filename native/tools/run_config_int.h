/* run_config_int.h: what run_config.c (the options, the environment, the worker) and
 * run_node.c (the node: GPUs, topology, port check, output masks) share, private to the CLI:
 * the parsed options, read by name. */
#ifndef TSP_RUN_CONFIG_INT_H
#define TSP_RUN_CONFIG_INT_H

/* An option's value (the command line, else PET_<NAME>), or NULL when not given. */
const char *tsp__runcfg_val(const char *name);
/* 1 when the flag option is set ("1" or "true"), else 0. */
int tsp__runcfg_flag(const char *name);
/* A whole-number option >= min, dflt when not given; a usage error (exit 2) otherwise. */
int tsp__runcfg_int(const char *name, int dflt, int min);

#endif
