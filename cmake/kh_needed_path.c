/* cmake/kh_needed_path.c: a build tool, run on the linked khamsin (KH_LIBC_PATH in
 *        CMakeLists.txt): its DT_NEEDED entry for a library becomes that library's absolute path,
 *        so that ld.so opens it at exec without searching any directory.
 * In:    kh_needed_path FILE NAME. FILE was linked with -soname,/dir/NAME: the DT_SONAME string
 *        carries the path into .dynstr (a linker cannot name a needed library by its path: it
 *        writes the library's own soname).
 * Out:   FILE rewritten in place: the DT_NEEDED entry whose string is NAME points at the soname's
 *        string, so does the file name of NAME's symbol version needs (DT_VERNEED: ld.so finds
 *        the library they name among the loaded ones by that name), and the DT_SONAME entry is
 *        removed (the entries after it move up one; the last
 *        becomes a second DT_NULL). An executable keeps no soname: left there, a dlopen of
 *        that path would match the program itself. Exit 0 (also when FILE was rewritten
 *        already), 1 with a message on stderr when FILE is not what this expects.
 * Why:   a search of a RUNPATH directory first probes its hwcaps subdirectories (glibc 2.36:
 *        glibc-hwcaps/x86-64-v4, -v3, -v2, tls/x86_64/x86_64, ..., x86_64: 10 failed openat and
 *        10 failed newfstatat at every exec); an absolute path is opened at once. ELF64 only,
 *        in the host's byte order (CMakeLists.txt builds it for 64-bit Linux, not when
 *        cross-compiling). */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *file, const char *why)
{
    fprintf(stderr, "kh_needed_path: %s: %s\n", file, why);
    return 1;
}

/* the file offset of [vaddr, vaddr + len), through the load segment it is in; 0: none */
static Elf64_Off file_offset(const Elf64_Phdr *ph, int n, Elf64_Addr vaddr, Elf64_Xword len)
{
    for (int i = 0; i < n; i++)
        if (ph[i].p_type == PT_LOAD && vaddr >= ph[i].p_vaddr &&
            vaddr + len <= ph[i].p_vaddr + ph[i].p_filesz)
            return vaddr - ph[i].p_vaddr + ph[i].p_offset;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: kh_needed_path FILE NAME\n");
        return 2;
    }
    const char *file = argv[1], *name = argv[2];
    FILE *f = fopen(file, "r+b");
    if (f == NULL)
        return fail(file, "cannot open");
    if (fseek(f, 0, SEEK_END) != 0)
        return fail(file, "cannot seek");
    long size = ftell(f);
    if (size < (long)sizeof(Elf64_Ehdr))
        return fail(file, "too short for an ELF file");
    unsigned char *b = malloc((size_t)size);
    rewind(f);
    if (b == NULL || fread(b, 1, (size_t)size, f) != (size_t)size)
        return fail(file, "cannot read");
    Elf64_Ehdr *eh = (Elf64_Ehdr *)b;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_phentsize != sizeof(Elf64_Phdr) ||
        eh->e_phoff + (Elf64_Off)eh->e_phnum * sizeof(Elf64_Phdr) > (Elf64_Off)size)
        return fail(file, "not a 64-bit ELF file");
    Elf64_Phdr *ph = (Elf64_Phdr *)(b + eh->e_phoff), *dynph = NULL;
    for (int i = 0; i < eh->e_phnum; i++)
        if (ph[i].p_type == PT_DYNAMIC)
            dynph = &ph[i];
    if (dynph == NULL || dynph->p_offset + dynph->p_filesz > (Elf64_Off)size)
        return fail(file, "no dynamic section");
    Elf64_Dyn *dyn = (Elf64_Dyn *)(b + dynph->p_offset);
    size_t ndyn = dynph->p_filesz / sizeof *dyn;
    Elf64_Addr strtab = 0, verneed = 0;
    Elf64_Xword strsz = 0, verneednum = 0;
    for (size_t i = 0; i < ndyn && dyn[i].d_tag != DT_NULL; i++) {
        if (dyn[i].d_tag == DT_STRTAB)
            strtab = dyn[i].d_un.d_ptr;
        else if (dyn[i].d_tag == DT_STRSZ)
            strsz = dyn[i].d_un.d_val;
        else if (dyn[i].d_tag == DT_VERNEED)
            verneed = dyn[i].d_un.d_ptr;
        else if (dyn[i].d_tag == DT_VERNEEDNUM)
            verneednum = dyn[i].d_un.d_val;
    }
    Elf64_Off stroff = file_offset(ph, eh->e_phnum, strtab, strsz);
    if (stroff == 0 || stroff + strsz > (Elf64_Off)size || strsz == 0 || b[stroff + strsz - 1])
        return fail(file, "no string table");
    const char *str = (const char *)(b + stroff);
    size_t soname = ndyn, needed = ndyn, namelen = strlen(name);
    for (size_t i = 0; i < ndyn && dyn[i].d_tag != DT_NULL; i++) {
        if ((dyn[i].d_tag != DT_SONAME && dyn[i].d_tag != DT_NEEDED) || dyn[i].d_un.d_val >= strsz)
            continue;
        const char *s = str + dyn[i].d_un.d_val;
        size_t n = strlen(s);
        int is_path = s[0] == '/' && n > namelen && s[n - namelen - 1] == '/' &&
                      strcmp(s + n - namelen, name) == 0;
        if (dyn[i].d_tag == DT_SONAME && is_path)
            soname = i;
        else if (dyn[i].d_tag == DT_NEEDED && strcmp(s, name) == 0)
            needed = i;
        else if (dyn[i].d_tag == DT_NEEDED && is_path)
            return 0; /* rewritten already */
    }
    if (soname == ndyn)
        return fail(file, "no DT_SONAME with a path ending in the library's name (-soname,/dir/NAME)");
    if (needed == ndyn)
        return fail(file, "no DT_NEEDED entry of that name");
    Elf64_Xword path = dyn[soname].d_un.d_val;
    /* the version needs: a chain of Elf64_Verneed, each vn_next bytes after the one before */
    Elf64_Off vn = verneed ? file_offset(ph, eh->e_phnum, verneed, sizeof(Elf64_Verneed)) : 0;
    for (Elf64_Xword i = 0; vn && i < verneednum; i++) {
        if (vn + sizeof(Elf64_Verneed) > (Elf64_Off)size)
            return fail(file, "a version need past the end of the file");
        Elf64_Verneed *v = (Elf64_Verneed *)(b + vn);
        if (v->vn_file < strsz && strcmp(str + v->vn_file, name) == 0)
            v->vn_file = (Elf64_Word)path;
        if (v->vn_next == 0)
            break;
        vn += v->vn_next;
    }
    dyn[needed].d_un.d_val = path;
    memmove(&dyn[soname], &dyn[soname + 1], (ndyn - soname - 1) * sizeof *dyn);
    memset(&dyn[ndyn - 1], 0, sizeof *dyn); /* DT_NULL */
    rewind(f);
    if (fwrite(b, 1, (size_t)size, f) != (size_t)size || fclose(f) != 0)
        return fail(file, "cannot write");
    free(b);
    return 0;
}
