/* stub_thread.h: the thread that the stub driver libraries (stub_cuda.c in cuInit,
 * stub_nvml.c in nvmlInit_v2) start, as the real driver does: one thread that lives as long
 * as the process, started with the caller's signal mask (pthread_create keeps it). A
 * process-directed signal that the caller blocks but this thread does not (SIGCHLD to an
 * agent that blocked it too late) is delivered here and discarded, as with the real driver's
 * thread: what the CPU tests must be able to see (tests/unit/test_sigchld.c).
 * STUB_GPU_NO_THREAD=1 leaves it out. Included by one stub each: its statics are that
 * library's own. */
#ifndef TSP_STUB_THREAD_H
#define TSP_STUB_THREAD_H
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *stub_driver_thread(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static const char *stub_thread_name;

static void stub_thread_start_once(void)
{
    const char *off = getenv("STUB_GPU_NO_THREAD");
    if (off && strcmp(off, "1") == 0)
        return;
    pthread_t t;
    if (pthread_create(&t, NULL, stub_driver_thread, NULL) == 0) {
        pthread_setname_np(t, stub_thread_name);
        pthread_detach(t);
    }
}

/* Starts the thread once per process; name: its /proc comm (at most 15 bytes). */
static void stub_thread_start(const char *name)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    stub_thread_name = name;
    pthread_once(&once, stub_thread_start_once);
}
#endif
