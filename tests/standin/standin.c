/* Recording stand-in for python.exe / conda.exe in the launcher tests (built with mingw-w64, run by Wine).
 * Appends "<program> arg <value>" per argument and "<program> env NAME=value" for the variables the
 * launchers set to the file named by STANDIN_LOG, then exits with STANDIN_EXIT_<PROGRAM> (default 0). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    static const char *watched[] = {"USE_LIBUV", "MASTER_ADDR", "MASTER_PORT", "DDP_LAUNCHER", "VIRTUAL_ENV", 0};
    const char *base = argv[0];
    for (const char *p = argv[0]; *p; p++)
        if (*p == '\\' || *p == '/') base = p + 1;
    char program[64] = {0};
    for (size_t i = 0; base[i] && base[i] != '.' && i < sizeof program - 1; i++)
        program[i] = (char)tolower((unsigned char)base[i]);

    const char *log_path = getenv("STANDIN_LOG");
    FILE *log = log_path ? fopen(log_path, "a") : NULL;
    if (!log) return 120;
    fprintf(log, "%s start\n", program);
    for (int i = 1; i < argc; i++) fprintf(log, "%s arg %s\n", program, argv[i]);
    for (int i = 0; watched[i]; i++) {
        const char *value = getenv(watched[i]);
        fprintf(log, "%s env %s=%s\n", program, watched[i], value ? value : "<unset>");
    }
    fclose(log);

    char exit_name[96] = "STANDIN_EXIT_";
    for (size_t i = 0, n = strlen(exit_name); program[i] && n + i < sizeof exit_name - 1; i++)
        exit_name[n + i] = (char)toupper((unsigned char)program[i]);
    const char *code = getenv(exit_name);
    return code ? atoi(code) : 0;
}
