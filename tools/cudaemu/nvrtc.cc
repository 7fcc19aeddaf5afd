// The emulator's NVRTC: "compiles" a CUDA C source by putting
// keel_cuda_emu.h (found next to this library) before it and a thunk per
// kernel after it, and building that with g++ (KEEL_CUDA_EMU_CXX, default
// g++) into a shared object. The image it returns is "KEELEMU1", the
// object's length and its bytes, which only the emulator's driver loads.
#include <dlfcn.h>
#include <errno.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#define API extern "C" __attribute__((visibility("default")))

extern char** environ;

enum {
  SUCCESS = 0,
  OUT_OF_MEMORY = 1,
  INVALID_INPUT = 3,
  INVALID_PROGRAM = 4,
  INVALID_OPTION = 5,
  COMPILATION = 6,
};

namespace {

struct Program {
  std::string src, name, log, image;
};

std::string own_dir() {
  Dl_info info;
  if (!dladdr((void*)&own_dir, &info) || !info.dli_fname) return ".";
  char* abs = realpath(info.dli_fname, nullptr);  // the library may have been opened by a relative path
  std::string p = abs ? abs : info.dli_fname;
  free(abs);
  size_t i = p.rfind('/');
  return i == std::string::npos ? "." : p.substr(0, i);
}

// strip_comments blanks out // and /* */ comments (keeping newlines and
// string literals), so the kernel scan below sees code only.
std::string strip_comments(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); i++) {
    if (out[i] == '"') {
      for (i++; i < out.size() && out[i] != '"'; i++)
        if (out[i] == '\\') i++;
    } else if (out.compare(i, 2, "//") == 0) {
      for (; i < out.size() && out[i] != '\n'; i++) out[i] = ' ';
    } else if (out.compare(i, 2, "/*") == 0) {
      size_t e = out.find("*/", i + 2);
      e = e == std::string::npos ? out.size() : e + 2;
      for (; i < e; i++)
        if (out[i] != '\n') out[i] = ' ';
      i--;
    }
  }
  return out;
}

bool ident(char c) { return isalnum((unsigned char)c) || c == '_'; }

// kernels finds every `__global__ void [__launch_bounds__(X)] name(` and
// returns (name, X or "1024").
std::vector<std::pair<std::string, std::string>> kernels(const std::string& src) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string code = strip_comments(src);
  auto skip = [&](size_t i) {
    while (i < code.size() && isspace((unsigned char)code[i])) i++;
    return i;
  };
  for (size_t i = code.find("__global__"); i != std::string::npos; i = code.find("__global__", i + 1)) {
    size_t j = skip(i + 10);
    if (code.compare(j, 4, "void") != 0) continue;
    j = skip(j + 4);
    std::string bounds = "1024";
    if (code.compare(j, 17, "__launch_bounds__") == 0) {
      size_t a = code.find('(', j), depth = 0, k = a;
      for (; k < code.size(); k++) {
        if (code[k] == '(') depth++;
        if (code[k] == ')' && --depth == 0) break;
      }
      std::string args = code.substr(a + 1, k - a - 1);
      bounds = args.substr(0, args.find(','));  // the first argument: max threads per block
      j = skip(k + 1);
    }
    size_t e = j;
    while (e < code.size() && ident(code[e])) e++;
    if (e > j && code[skip(e)] == '(') out.push_back({code.substr(j, e - j), bounds});
  }
  return out;
}

int run(const std::vector<std::string>& argv, std::string* log) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back((char*)a.c_str());
  args.push_back(nullptr);
  char errpath[] = "/tmp/keel-emu-cc-XXXXXX";
  int fd = mkstemp(errpath);
  if (fd < 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 1);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fd);
  int status = -1;
  if (rc == 0) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    *log += "cannot run " + argv[0] + ": " + strerror(rc) + "\n";
  }
  std::ifstream f(errpath);
  std::stringstream ss;
  ss << f.rdbuf();
  *log += ss.str();
  unlink(errpath);
  return rc == 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

API int nvrtcVersion(int* major, int* minor) {
  *major = 13;
  *minor = 0;
  return SUCCESS;
}
API int nvrtcGetNumSupportedArchs(int* n) {
  *n = 2;
  return SUCCESS;
}
API int nvrtcGetSupportedArchs(int* archs) {
  archs[0] = 80;
  archs[1] = 90;
  return SUCCESS;
}
API const char* nvrtcGetErrorString(int r) {
  switch (r) {
    case SUCCESS: return "NVRTC_SUCCESS";
    case OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case COMPILATION: return "NVRTC_ERROR_COMPILATION";
  }
  return "NVRTC_ERROR_UNKNOWN";
}
API int nvrtcCreateProgram(uintptr_t* prog, const char* src, const char* name, int nh, const char* const* h,
                           const char* const* hn) {
  (void)h;
  (void)hn;
  if (!prog || !src || nh != 0) return INVALID_INPUT;
  *prog = (uintptr_t) new Program{src, name ? name : "default_program", "", ""};
  return SUCCESS;
}
API int nvrtcDestroyProgram(uintptr_t* prog) {
  if (!prog || !*prog) return INVALID_PROGRAM;
  delete (Program*)*prog;
  *prog = 0;
  return SUCCESS;
}

// nvrtcCompileProgram accepts the options keel passes (the target,
// -std=c++17, -default-device, --fmad=false) and refuses fused
// multiply-adds: the emulator compiles with -ffp-contract=off only.
API int nvrtcCompileProgram(uintptr_t prog, int nopt, const char* const* opts) {
  Program* p = (Program*)prog;
  if (!p) return INVALID_PROGRAM;
  bool nofma = false;
  for (int i = 0; i < nopt; i++) {
    std::string o = opts[i];
    if (o == "--fmad=false" || o == "-fmad=false") nofma = true;
    else if (o.rfind("--gpu-architecture=", 0) == 0 || o.rfind("-arch=", 0) == 0 || o == "-std=c++17" ||
             o == "-default-device" || o == "-Xptxas" || o == "-v" || o == "--ptxas-options=-v") {
    } else {
      p->log = "keel CUDA emulator: option " + o + " is not emulated\n";
      return INVALID_OPTION;
    }
  }
  if (!nofma) {
    p->log = "keel CUDA emulator: compiles with --fmad=false only (no contraction, as keel's kernels ask)\n";
    return INVALID_OPTION;
  }
  char dir[] = "/tmp/keel-emu-nvrtc-XXXXXX";
  if (!mkdtemp(dir)) return OUT_OF_MEMORY;
  std::string src = std::string(dir) + "/kernel.cc", obj = std::string(dir) + "/kernel.so";
  {
    std::ofstream f(src);
    f << "#include \"" << own_dir() << "/keel_cuda_emu.h\"\n" << p->src << "\n\n#line 1 \"keel-emu-thunks\"\n";
    for (auto& [name, bounds] : kernels(p->src)) {
      f << "extern \"C\" __attribute__((visibility(\"default\"))) void keel_emu_thunk_" << name
        << "(void** p) { keel_emu::call(" << name << ", p); }\n";
      f << "extern \"C\" __attribute__((visibility(\"default\"))) int keel_emu_pack_" << name
        << "(void** p, unsigned long* out, int cap) { return keel_emu::pack(" << name << ", p, out, cap); }\n";
      f << "extern \"C\" __attribute__((visibility(\"default\"))) const int keel_emu_bounds_" << name << " = ("
        << bounds << ");\n";
    }
  }
  const char* cxx = getenv("KEEL_CUDA_EMU_CXX");
  // KEEL_CUDA_EMU_MMA=1: the kernels' tensor-core paths (prelude.cuh's
  // KEEL_MMA_TILES), through mma16816's stand-in.
  const char* mma = getenv("KEEL_CUDA_EMU_MMA");
  std::vector<std::string> argv = {cxx && *cxx ? cxx : "g++", "-std=c++17", "-O3", "-g", "-march=x86-64-v3", "-fPIC",
                                   "-shared", "-ffp-contract=off", "-fno-fast-math", "-fvisibility=hidden",
                                   "-fno-strict-aliasing", "-Wno-unknown-pragmas"};
  if (mma && std::string(mma) == "1") argv.push_back("-DKEEL_EMU_MMA");
  for (const std::string& a : {std::string("-x"), std::string("c++"), src, std::string("-o"), obj}) argv.push_back(a);
  int rc = run(argv, &p->log);
  if (rc == 0) {
    std::ifstream f(obj, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string so = ss.str();
    uint64_t n = so.size();
    p->image = std::string("KEELEMU1") + std::string((const char*)&n, 8) + so;
  }
  unlink(src.c_str());
  unlink(obj.c_str());
  rmdir(dir);
  return rc == 0 && !p->image.empty() ? SUCCESS : COMPILATION;
}
API int nvrtcGetProgramLogSize(uintptr_t prog, size_t* n) {
  if (!prog) return INVALID_PROGRAM;
  *n = ((Program*)prog)->log.size() + 1;
  return SUCCESS;
}
API int nvrtcGetProgramLog(uintptr_t prog, char* out) {
  if (!prog) return INVALID_PROGRAM;
  auto& l = ((Program*)prog)->log;
  memcpy(out, l.c_str(), l.size() + 1);
  return SUCCESS;
}
static int size(uintptr_t prog, size_t* n) {
  if (!prog) return INVALID_PROGRAM;
  *n = ((Program*)prog)->image.size();
  return SUCCESS;
}
static int get(uintptr_t prog, char* out) {
  if (!prog) return INVALID_PROGRAM;
  auto& im = ((Program*)prog)->image;
  memcpy(out, im.data(), im.size());
  return SUCCESS;
}
API int nvrtcGetPTXSize(uintptr_t prog, size_t* n) { return size(prog, n); }
API int nvrtcGetPTX(uintptr_t prog, char* out) { return get(prog, out); }
API int nvrtcGetCUBINSize(uintptr_t prog, size_t* n) { return size(prog, n); }
API int nvrtcGetCUBIN(uintptr_t prog, char* out) { return get(prog, out); }

// keel_cuda_emulator marks the library as the emulator's (kernels/cuda reads it).
API const int keel_cuda_emulator = 1;
