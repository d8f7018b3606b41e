/* pyboot.h (internal): the Python bootstrap of script workers (pyboot.c says why). */
#ifndef TSP_PYBOOT_H
#define TSP_PYBOOT_H

/* `python -u -c tsp__pyboot_script SCRIPT ARGS...` runs SCRIPT as `python -u SCRIPT ARGS...`
 * would, and `python -u -c tsp__pyboot_module -m MODULE ARGS...` as `python -u -m MODULE
 * ARGS...`, both ending without interpreter finalization. */
extern const char tsp__pyboot_script[];
extern const char tsp__pyboot_module[];
#endif
