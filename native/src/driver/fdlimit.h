/* fdlimit.h (internal): the driver's descriptor limit (fdlimit.c). */
#ifndef TSP_FDLIMIT_H
#define TSP_FDLIMIT_H

/* Raises RLIMIT_NOFILE's soft limit to the hard one: 1 when raised, 0 when it was already,
 * -errno when it cannot be read or set. */
int tsp__fdlimit_raise(void);

#endif
