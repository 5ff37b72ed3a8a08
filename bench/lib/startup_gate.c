/* bench/lib/startup_gate.c: bench/lib/startuptimeline.py's launcher. Waits for one byte on
 * stdin, then execs argv[1..]: the measurer starts it, tells the tracer to follow its pid, and
 * only then lets it exec, so that the trace holds the whole exec of the server.
 *   cc -O2 -o startup_gate bench/lib/startup_gate.c */
#include <unistd.h>

int main(int argc, char **argv)
{
    char b;
    if (argc < 2 || read(0, &b, 1) != 1)
        return 9;
    execv(argv[1], argv + 1);
    return 127;
}
