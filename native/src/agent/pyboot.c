/* pyboot.c: the bootstrap that a Python worker runs its script or module through.

Why: CPython's interpreter finalization can turn a finished training into SIGABRT (torch's
gloo exit race, docs/cli.md). A worker is therefore started as
    python -u -c BOOT SCRIPT ARGS        (or  python -u -c BOOT -m MODULE ARGS)
and BOOT runs the script the way `python -u SCRIPT` would, then ends the process the way
torchspark.worker._fn_runner does: join non-daemon threads, atexit callbacks, flush, os._exit.

What BOOT reproduces of `python SCRIPT` (checked side by side in tests/e2e/test_script_exit.py):
  - sys.argv [SCRIPT, ARGS...] (for -m: ['-m', ARGS...] until runpy puts the module's path
    there), sys.orig_argv without '-c BOOT', sys.path[0] = dirname(realpath(SCRIPT)) (for -m:
    the cwd; a directory or zip file: itself; nothing under PYTHONSAFEPATH);
  - the code runs in the real __main__ module's dict (so __main__ keeps its identity for
    pickle, multiprocessing and atexit callbacks), with __file__ (absolute, as in 3.9+),
    __cached__ and __loader__ as CPython sets them, removed again after a normal end;
    .pyc files, directories and zip files (their __main__), -m through runpy's own
    _run_module_as_main as `python -m` does;
  - exit status: 0; SystemExit code None -> 0, int n -> n & 255 (255 beyond a C long),
    anything else printed to stderr -> 1; an uncaught exception -> sys.excepthook with the
    traceback starting at the script's frame (sys.last_* set), 1; KeyboardInterrupt -> the
    traceback, then death by SIGINT as CPython does; stdout that cannot be flushed -> 120.
  - then stderr and stdout flushed (errors ignored) as after `python SCRIPT`'s code ran,
    threading._shutdown(), the atexit callbacks, every open writable file object flushed
    (finalization would have closed them), stdout/stderr flushed, C stdio flushed (exit()
    would have; through ctypes when the interpreter has it; not after KeyboardInterrupt,
    where CPython dies by SIGINT without exit()), os._exit.
Beyond `python SCRIPT`, BOOT registers faulthandler on SIGRTMIN+8 (all threads, to fd 2):
that signal makes the worker print every thread's Python stack on its stderr and go on
(the hang doctor's dump, docs/cli.md); it is not a Python-level handler, so
signal.getsignal() and faulthandler.is_enabled() look as under `python SCRIPT`. It also blocks
SIGRTMIN+8 and SIGRTMIN+9 (the signal mask, inherited by threads and child processes) and
starts one thread (_thread, not in threading.enumerate()), the only one that takes SIGRTMIN+8
(so a dump never interrupts a system call of the training's: poll(2) is not restarted after a
handler, and torch 2.4's TCPStore fails on its EINTR), that waits for SIGRTMIN+9 with sigwait
(which glibc resumes after the dump's handler) and then writes torch's
flight recorder's last collectives on fd 2, one "torchspark: flight recorder: ..." line each
(docs/protocol.md 1.9): that needs the GIL, which a rank blocked in a collective released.
It imports nothing of torchspark (--python may name an interpreter without it) and contains
no '$', because every worker argument goes through torchrun's $local_rank substitution. */
#include "pyboot.h"

#define BOOT_BODY                                                                                  \
    "def _tsp_boot(m):\n"                                                                          \
    " import os,sys\n"                                                                             \
    " g=globals();del g['_tsp_boot']\n"                                                            \
    " a=sys.argv;del a[0]\n"                                                                       \
    " o=getattr(sys,'orig_argv',None)\n"                                                           \
    " if o and '-c' in o:i=o.index('-c');del o[i:i+2]\n"                                           \
    " sp=not getattr(sys.flags,'safe_path',0);fl=ki=st=0\n"                                        \
    " def fq(C,json):\n"                                                                           \
    "  E=[];N=X=0\n"                                                                               \
    "  for b,f in('gloo','_dump_fr_trace_json'),('nccl','_dump_nccl_trace_json'):\n"               \
    "   f=getattr(C,f,None);N+=f is None;X=X or(f is None and b=='gloo')\n"                        \
    "   try:E+=json.loads(f(backend=b)if b=='gloo'else f()).get('entries')or[]\n"                  \
    "   except Exception:pass\n"                                                                   \
    "  if N==2:return['not available (this torch has no flight recorder)']\n"                      \
    "  G={}\n"                                                                                     \
    "  for e in sorted(E,key=lambda e:e.get('record_id',0)):\n"                                    \
    "   G.setdefault(tuple(e.get('process_group')or('?','?')),[]).append(e)\n"                     \
    "  L=[]\n"                                                                                     \
    "  for g,v in list(G.items())[:8]:\n"                                                          \
    "   for e in v[-3:]:\n"                                                                        \
    "    n=str(e.get('profiling_name','?')).split(':',1)[-1];t=e.get('state')\n"                   \
    "    c='completed'if e.get('retired')or t=='completed'else'not completed (%s)'%t\n"            \
    "    q=e.get('p2p_seq_id'if e.get('is_p2p')else'collective_seq_id')\n"                         \
    "    L.append('pg %s (%s): %s #%s: %s'%(g[0],g[-1],n,q,c))\n"                                  \
    "  return L or['no collective recorded (%s)'%('this torch records NCCL\\'s only'if X else\n"   \
    "   'TORCH_FR_BUFFER_SIZE=0, or none ran yet')]\n"                                             \
    " def fw(Q,R,D):\n"                                                                            \
    "  Q.pthread_sigmask(Q.SIG_UNBLOCK,[D])\n"                                                     \
    "  while 1:\n"                                                                                 \
    "   Q.sigwait([R])\n"                                                                          \
    "   try:\n"                                                                                    \
    "    d=sys.modules.get('torch.distributed')\n"                                                 \
    "    if d and d.is_available()and d.is_initialized():\n"                                       \
    "     import json;L=fq(sys.modules.get('torch._C._distributed_c10d'),json)\n"                  \
    "    else:L=['not available (torch.distributed is not initialized)']\n"                        \
    "   except Exception as e:L=['not available (%r)'%e]\n"                                        \
    "   L=''.join('torchspark: flight recorder: %s\\n'%x for x in L)\n"                            \
    "   try:os.write(2,L.encode('utf-8','replace'))\n"                                             \
    "   except Exception:pass\n"                                                                   \
    " try:import faulthandler as H,signal as Q;H.register(Q.SIGRTMIN+8,all_threads=True)\n"        \
    " except Exception:pass\n"                                                                     \
    " try:\n"                                                                                      \
    "  import _thread;R=Q.SIGRTMIN+9;D=Q.SIGRTMIN+8\n"                                             \
    "  Q.pthread_sigmask(Q.SIG_BLOCK,[R,D]);_thread.start_new_thread(fw,(Q,R,D))\n"                \
    " except Exception:pass\n"                                                                     \
    " try:\n"                                                                                      \
    "  if m:\n"                                                                                    \
    "   n=a.pop(1)\n"                                                                              \
    "   if sp:sys.path[0]=os.getcwd()\n"                                                           \
    "   import runpy;runpy._run_module_as_main(n,True)\n"                                          \
    "  else:\n"                                                                                    \
    "   f=a[0];p=os.path.join(os.getcwd(),f);i=None\n"                                             \
    "   for h in sys.path_hooks:\n"                                                                \
    "    try:i=h(p);break\n"                                                                       \
    "    except ImportError:pass\n"                                                                \
    "   if i is not None:\n"                                                                       \
    "    if sp:sys.path[0]=p\n"                                                                    \
    "    else:sys.path.insert(0,p)\n"                                                              \
    "    import runpy;runpy._run_module_as_main('__main__',False)\n"                               \
    "   else:\n"                                                                                   \
    "    if sp:sys.path[0]=os.path.dirname(os.path.realpath(f))\n"                                 \
    "    try:\n"                                                                                   \
    "     with open(p,'rb') as h:s=h.read()\n"                                                     \
    "    except OSError as e:\n"                                                                   \
    "     x=(o or[sys.executable])[0],p,e.errno,e.strerror\n"                                      \
    "     sys.stderr.write(\"%s: can't open file %r: [Errno %d] %s\\n\"%x);raise SystemExit(2)\n"  \
    "    import _frozen_importlib_external as E\n"                                                 \
    "    M=E.MAGIC_NUMBER\n"                                                                       \
    "    if p.endswith('.pyc')or s[:2]==M[:2]:\n"                                                  \
    "     if s[:4]!=M:raise RuntimeError('Bad magic number in .pyc file')\n"                       \
    "     import marshal;c=marshal.loads(s[16:]);L=E.SourcelessFileLoader\n"                       \
    "    else:c=compile(s,p,'exec',dont_inherit=True);L=E.SourceFileLoader\n"                      \
    "    g['__file__']=p;g['__cached__']=None;g['__loader__']=L('__main__',p);fl=1\n"              \
    "    exec(c,g)\n"                                                                              \
    " except SystemExit as e:\n"                                                                   \
    "  c=e.code;fl=0\n"                                                                            \
    "  if c is None:pass\n"                                                                        \
    "  elif isinstance(c,int):st=c&255 if -2**63<=c<2**63 else 255\n"                              \
    "  else:\n"                                                                                    \
    "   st=1\n"                                                                                    \
    "   try:sys.stderr.write(str(c));sys.stderr.write('\\n')\n"                                    \
    "   except Exception:pass\n"                                                                   \
    " except BaseException as e:\n"                                                                \
    "  t=e.__traceback__.tb_next;e.__traceback__=t\n"                                              \
    "  st=1;ki=isinstance(e,KeyboardInterrupt)\n"                                                  \
    "  sys.last_type,sys.last_value=type(e),e;sys.last_traceback=t\n"                              \
    "  if sys.version_info>=(3,12):sys.last_exc=e\n"                                               \
    "  try:sys.excepthook(type(e),e,t)\n"                                                          \
    "  except BaseException as x:\n"                                                               \
    "   sys.stderr.write('Error in sys.excepthook:\\n')\n"                                         \
    "   sys.__excepthook__(type(x),x,x.__traceback__)\n"                                           \
    "   sys.stderr.write('\\nOriginal exception was:\\n')\n"                                       \
    "   sys.__excepthook__(type(e),e,t)\n"                                                         \
    " for f in sys.stderr,sys.stdout:\n"                                                           \
    "  try:f.flush()\n"                                                                            \
    "  except BaseException:pass\n"                                                                \
    " if fl:g.pop('__file__',0);g.pop('__cached__',0)\n"                                           \
    " t=sys.modules.get('threading')\n"                                                            \
    " if t:\n"                                                                                     \
    "  try:t._shutdown()\n"                                                                        \
    "  except BaseException as x:sys.stderr.write('Exception ignored in: %r\\n%r\\n'%(t,x))\n"     \
    " import atexit,gc,io;atexit._run_exitfuncs()\n"                                               \
    " S=sys.stdout,sys.stderr;T=io.TextIOWrapper\n"                                                \
    " W=T,io.BufferedWriter,io.BufferedRandom\n"                                                   \
    " F=[f for f in gc.get_objects()if type(f)in W and all(f is not x for x in S)]\n"              \
    " for f in sorted(F,key=lambda f:type(f)is not T)+list(S):\n"                                  \
    "  try:\n"                                                                                     \
    "   if f.closed:continue\n"                                                                    \
    "  except Exception:continue\n"                                                                \
    "  try:f.flush()\n"                                                                            \
    "  except Exception as x:\n"                                                                   \
    "   if f is S[0]:st=120;sys.stderr.write('Exception ignored in: %r\\n%r\\n'%(f,x))\n"          \
    " if ki:\n"                                                                                    \
    "  import signal;signal.signal(2,signal.SIG_DFL);os.kill(os.getpid(),2);st=130\n"              \
    " try:import ctypes;ctypes.CDLL(None).fflush(None)\n"                                          \
    " except Exception:pass\n"                                                                     \
    " os._exit(st)\n"

const char tsp__pyboot_script[] = BOOT_BODY "_tsp_boot(0)\n";
const char tsp__pyboot_module[] = BOOT_BODY "_tsp_boot(1)\n";
