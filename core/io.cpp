// Atomic file writes and whole-file reads (io.h).
#include "regen/core/io.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <vector>

#include "regen/core/error.h"

namespace regen {
namespace {

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

namespace {

// Why an existing `path` must not be replaced ("" when it is a regular file or does not exist):
// renaming over a device node, a FIFO or a socket would destroy it.
std::string not_regular(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  return "'" + path + "' is " + kind + "; regen writes only regular files";
}

}  // namespace

namespace {

// The temporaries being written, so that SIGINT, SIGTERM or SIGHUP removes them before the
// process dies (the targets are untouched until a commit renames over them). A fixed table of
// slots: the handler only reads it and calls unlink, both safe in a signal handler.
constexpr int kTempSlots = 64;
struct TempSlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 holds a path
  char path[4096];
};
TempSlot g_temps[kTempSlots];

extern "C" void remove_temporaries_and_die(int sig) {
  for (TempSlot& s : g_temps) {
    if (s.state.load() == 2) ::unlink(s.path);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Installs the handler for the signals whose handling is the default (a program that handles
// one itself keeps its own); checked at every writer, so a default restored later is covered.
void install_temp_cleanup() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL)
      continue;
    struct sigaction sa {};
    sa.sa_handler = remove_temporaries_and_die;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

int claim_temp_slot(const std::string& path) {
  if (path.size() >= sizeof(TempSlot::path)) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = 0;
    if (g_temps[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
      g_temps[i].state.store(2);
      return i;
    }
  }
  return -1;  // more than kTempSlots at once: this one is not cleaned up on a signal
}

void release_temp_slot(int slot) {
  if (slot >= 0) g_temps[slot].state.store(0);
}

}  // namespace

namespace {

// `path`, or where it leads when it is a symbolic link: the file is written through the link, so
// the link stays a link (a rename over it would replace it with a regular file).
std::string write_target(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
  char buf[PATH_MAX];
  REGEN_CHECK(::realpath(path.c_str(), buf) != nullptr, "cannot write '", path,
              "': it is a symbolic link that leads to no file (", std::strerror(errno),
              "); remove it or point it at a file");
  return buf;
}

}  // namespace

void sweep_stale_temporaries(const std::string& path) {
  const std::string folder = folder_of(path);
  const auto slash = path.find_last_of('/');
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // PID.N
    const auto dot = rest.find('.');
    if (dot == std::string::npos || dot == 0) continue;
    const std::string pid_text = rest.substr(0, dot), n_text = rest.substr(dot + 1);
    auto digits = [](const std::string& t) {
      return !t.empty() && t.size() < 10 && t.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(pid_text) || !digits(n_text)) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or unsure
    ::unlink(e.path().c_str());
  }
}

void sweep_stale_temporaries_of(const std::string& path) {
  if (path.empty()) return;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char buf[PATH_MAX];
    if (::realpath(path.c_str(), buf) == nullptr) return;  // a link to nothing: nothing written
    sweep_stale_temporaries(buf);
    return;
  }
  sweep_stale_temporaries(path);
}

AtomicFileWriter::AtomicFileWriter(const std::string& path) {
  REGEN_CHECK(!path.empty(), "cannot write to an empty path");
  path_ = write_target(path);
  const std::string why = not_regular(path_);
  REGEN_CHECK(why.empty(), "cannot write '", path, "': ", why);
  sweep_stale_temporaries(path_);
  // pid and a counter: unique across processes and across threads of this one (O_EXCL).
  static std::atomic<unsigned> counter{0};
  tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  install_temp_cleanup();
  slot_ = claim_temp_slot(tmp_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) release_temp_slot(slot_);
  REGEN_CHECK(fd_ >= 0, "cannot create '", tmp_, "' to write '", path_,
              "': ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {  // not committed: an error was thrown on the way
    ::close(fd_);
    ::unlink(tmp_.c_str());
    release_temp_slot(slot_);
  } else if (synced_) {  // synced, never renamed: another file of its group failed
    ::unlink(tmp_.c_str());
    release_temp_slot(slot_);
  }
}

void AtomicFileWriter::write(const void* data, uint64_t n) {
  REGEN_CHECK(fd_ >= 0, "writing '", path_, "': the file was already committed");
  const char* p = static_cast<const char*>(data);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd_, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    REGEN_CHECK(w > 0, "writing '", path_, "' failed after ", written_ + done,
                " bytes: ", std::strerror(w == 0 ? EIO : errno));
    done += static_cast<uint64_t>(w);
  }
  written_ += n;
}

void AtomicFileWriter::sync() {
  REGEN_CHECK(fd_ >= 0, "writing '", path_, "': the file was already committed");
  const int fd = fd_;
  fd_ = -1;
  int err = ::fsync(fd) == 0 ? 0 : errno;
  // close() releases the descriptor even when it reports an error; never retry it.
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp_.c_str());
    release_temp_slot(slot_);
    REGEN_FAIL("writing '", path_, "' failed: ", std::strerror(err));
  }
  synced_ = true;
}

void AtomicFileWriter::commit() {
  if (!synced_) sync();
  synced_ = false;
  // However the rename ends, the temporary is gone or renamed: no longer the signal handler's.
  struct Release {
    int slot;
    ~Release() { release_temp_slot(slot); }
  } release{slot_};
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    REGEN_FAIL("cannot move '", tmp_, "' to '", path_, "': ", std::strerror(err));
  }
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFileWriter out(path);
  out.write(content.data(), content.size());
  out.commit();
}

std::string content_id(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& path_and_content) {
  std::vector<std::unique_ptr<AtomicFileWriter>> files;
  for (const auto& [path, content] : path_and_content) {
    files.push_back(std::make_unique<AtomicFileWriter>(path));
    files.back()->write(content.data(), content.size());
  }
  for (auto& f : files) f->sync();  // every file whole on disk before the first rename
  // The renames as one unit against SIGINT, SIGTERM and SIGHUP: held back until every file is in
  // place (then delivered as usual), so Ctrl-C never leaves new files beside old ones.
  sigset_t block, old;
  sigemptyset(&block);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, sig);
  const bool blocked = ::pthread_sigmask(SIG_BLOCK, &block, &old) == 0;
  struct Restore {
    bool blocked;
    sigset_t old;
    ~Restore() {
      if (blocked) ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
  } restore{blocked, old};
  for (auto& f : files) f->commit();
}

FolderLock::FolderLock(const std::string& dir, const std::string& flag) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REGEN_CHECK(fd_ >= 0, flag, " '", dir, "': cannot open the folder: ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    REGEN_CHECK(err != EWOULDBLOCK, flag, " '", dir,
                "' is being written by another regen process; "
                "wait for it to finish or pass another folder");
    REGEN_FAIL(flag, " '", dir, "': cannot lock the folder: ", std::strerror(err));
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the lock
}

OutputFolder::OutputFolder(const std::string& dir, const std::string& flag)
    : uncaught_(std::uncaught_exceptions()) {
  REGEN_CHECK(!dir.empty(), flag, " is empty: give a folder");
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    REGEN_CHECK(S_ISDIR(st.st_mode), flag, " ", dir, " is a file, not a folder");
  } else {
    // The missing folders from the outermost in.
    std::vector<std::string> missing;
    for (std::filesystem::path p = std::filesystem::path(dir).lexically_normal(); !p.empty();
         p = p.parent_path()) {
      if (::stat(p.c_str(), &st) == 0) {
        REGEN_CHECK(S_ISDIR(st.st_mode), flag, " ", dir, ": '", p.string(),
                    "' is a file, not a folder");
        break;
      }
      missing.insert(missing.begin(), p.string());
      if (p == p.parent_path()) break;
    }
    try {
      for (const std::string& m : missing) {
        REGEN_CHECK(::mkdir(m.c_str(), 0755) == 0 || errno == EEXIST, flag, " ", dir,
                    ": cannot create the folder '", m, "': ", std::strerror(errno));
        created_.push_back(m);
      }
    } catch (...) {
      for (auto it = created_.rbegin(); it != created_.rend(); ++it) ::rmdir(it->c_str());
      throw;
    }
  }
  try {
    lock_ = std::make_unique<FolderLock>(dir, flag);
  } catch (...) {
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) ::rmdir(it->c_str());
    throw;
  }
}

OutputFolder::~OutputFolder() {
  lock_.reset();
  if (std::uncaught_exceptions() > uncaught_) {
    // rmdir removes only an empty folder: anything the command did commit stays.
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) ::rmdir(it->c_str());
  }
}

std::string read_file(const std::string& path) {
  REGEN_CHECK(!path.empty(), "cannot read an empty path");
  sweep_stale_temporaries_of(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REGEN_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    REGEN_FAIL("cannot stat '", path, "': ", std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    REGEN_FAIL("'", path, "' is a directory, not a regular file");
  }
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      REGEN_FAIL("reading '", path, "' failed after ", out.size(), " bytes: ", std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string why_not_writable(const std::string& given) {
  if (given.empty()) return "the path is empty";
  if (given.back() == '/') return "'" + given + "' names a folder; give a file name";
  // A symbolic link is written through (AtomicFileWriter): what it leads to is checked.
  std::string path = given;
  struct stat lst;
  if (::lstat(given.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
    char buf[PATH_MAX];
    if (::realpath(given.c_str(), buf) == nullptr) {
      return "'" + given +
             "' is a symbolic link that leads to no file; remove it or point it at "
             "a file";
    }
    path = buf;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return "'" + path + "' is a directory; give a file name";
  }
  if (const std::string why = not_regular(path); !why.empty()) return why;
  const std::string dir = folder_of(path);
  if (::stat(dir.c_str(), &st) != 0) {
    return "folder '" + dir + "' does not exist (" + std::strerror(errno) + ")";
  }
  if (!S_ISDIR(st.st_mode)) return "'" + dir + "' is not a folder";
  // Try what write_file_atomic will do: create a file next to the target, then remove it.
  std::string probe = (dir == "/" ? std::string() : dir) + "/.regen-write-check.XXXXXX";
  std::vector<char> name(probe.begin(), probe.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return "cannot create files in folder '" + dir + "': " + std::strerror(errno);
  ::close(fd);
  ::unlink(name.data());
  return "";
}

std::string resolved_path(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf)) return buf;  // an existing file (through links)
  const auto slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (::realpath(dir.c_str(), buf)) return std::string(buf) + "/" + name;
  return path;
}

namespace {

// A file to compare: its resolved path, and its device and inode when it exists (a hard link has
// another path but the same inode).
struct FileIdentity {
  std::string resolved;
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  explicit FileIdentity(const std::string& path) : resolved(resolved_path(path)) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      exists = true;
      dev = st.st_dev;
      ino = st.st_ino;
    }
  }
  bool same(const FileIdentity& o) const {
    if (exists && o.exists) return dev == o.dev && ino == o.ino;
    return resolved == o.resolved;
  }
};

}  // namespace

void check_distinct_files(const std::vector<NamedFile>& outputs,
                          const std::vector<NamedFile>& inputs) {
  std::vector<std::pair<FileIdentity, const std::string*>> seen;  // (file, its name)
  for (const NamedFile& f : inputs) {
    if (!f.path.empty()) seen.emplace_back(FileIdentity(f.path), &f.name);
  }
  for (const NamedFile& f : outputs) {
    if (f.path.empty()) continue;
    FileIdentity id(f.path);
    for (const auto& [other, other_name] : seen) {
      REGEN_CHECK(!id.same(other), f.name, " is the same file as ", *other_name,
                  ": give each output its own path, never an input's");
    }
    seen.emplace_back(std::move(id), &f.name);
  }
}

}  // namespace regen
