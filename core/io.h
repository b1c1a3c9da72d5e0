// File helpers: atomic writes (temporary file in the same folder, fsync, rename), so a crash or
// a full disk never leaves a half-written checkpoint, profile or table behind; whole-file reads;
// an up-front check that an output path can be written, and that no output is an input. Tests:
// tests/test_cli.cpp, tests/python/test_files.py.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace regen {

// Writes a file atomically (a temporary file in the same folder, fsync, rename), piece by piece
// as the caller adds them, so large data (tensor bytes) can go from where it lives straight to
// the file. Nothing appears at `path` until commit(); if commit() is never reached (an error was
// thrown on the way), the destructor closes the descriptor and removes the temporary file; on
// SIGINT, SIGTERM or SIGHUP (where the program left their handling at the default) the pending
// temporaries are removed before the process dies. An existing target that is not a regular
// file (a device node, a FIFO, a directory) is refused. A symbolic link is written through: the
// file it leads to is replaced and the link stays (a link that leads nowhere is refused). A
// temporary that a killed writer of the same target left (`path.tmp.PID.N` of a process that no
// longer exists) is removed. Errors throw regen::Error naming the path.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, uint64_t n);
  // Flushes the temporary to disk (fsync) and closes it; commit() then only renames. A group of
  // files syncs all before renaming any (write_files_atomic).
  void sync();
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool synced_ = false;
  int slot_ = -1;  // its entry in the table of temporaries removed on SIGINT, SIGTERM, SIGHUP
  uint64_t written_ = 0;
};

// Several files committed together (a command's outputs): every file is written in full to its
// temporary and synced before the first rename, so an error while writing any of them (a full
// disk, a bad path) leaves every old file as it was. SIGINT, SIGTERM and SIGHUP are held back
// during the renames, which take microseconds, and delivered once all are done; only SIGKILL or a
// crash in that window could leave some new files beside old ones.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& path_and_content);

// An id of `text` (FNV-1a, 64 bits, as 16 hex digits): files of one set carry the id of the one
// renamed last, so that a reader finds a set a killed writer left mixed (regen profile's
// profile.json, profile.txt and trace.json: remat/simulate/simulator.h load_profile).
std::string content_id(const std::string& text);

// Holds an exclusive advisory lock (flock) on a folder while a command writes into it, so that a
// second regen process writing the same folder stops at once with an error naming `flag` and
// the folder, instead of leaving its files mixed with the first's. Released when destroyed (or
// when the process ends, however it ends). Nothing is written into the folder.
class FolderLock {
 public:
  FolderLock(const std::string& dir, const std::string& flag);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

// A command's output folder, made ready before the work starts: created when missing (with any
// missing parents), or checked to be a folder, and locked (FolderLock). A command that fails
// after this (the object is destroyed while an exception unwinds) leaves no trace: the folders it
// created are removed again, innermost first, where they are still empty. Commands hold their
// outputs and commit them together at the end (write_files_atomic), so a failure never leaves
// new files beside old ones. Throws regen::Error naming `flag` and the folder.
class OutputFolder {
 public:
  OutputFolder(const std::string& dir, const std::string& flag);
  ~OutputFolder();
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

 private:
  std::vector<std::string> created_;  // outermost first
  int uncaught_ = 0;
  std::unique_ptr<FolderLock> lock_;
};

// Writes `content` to `path` atomically (one AtomicFileWriter). Throws regen::Error naming the path
// on failure; on every failure path the descriptor is closed and the temporary file removed.
void write_file_atomic(const std::string& path, const std::string& content);
// What a writer of `path` killed before it could clean up (SIGKILL, a power cut) left beside it:
// its temporaries `path.tmp.PID.N` of processes that no longer exist are removed (others, and
// those of live processes, are left alone; a folder that cannot be written is left as it is).
// Every AtomicFileWriter of `path` sweeps first, and so does every reader of a file (read_file,
// load_safetensors): a run killed while it saved leaves nothing once the file is written or read
// again. sweep_stale_temporaries_of follows a symbolic link to the file written through it.
void sweep_stale_temporaries(const std::string& path);
void sweep_stale_temporaries_of(const std::string& path);
// Reads a whole regular file (after sweep_stale_temporaries_of). Throws regen::Error naming the
// path when it does not exist, is a directory or cannot be read.
std::string read_file(const std::string& path);
// Why `path` cannot be written by write_file_atomic, or "" when it can: checks that its folder
// exists and accepts a new file (by creating and removing a temporary one) and that `path` is
// not a directory. Leaves nothing behind. For commands that write results only at the end.
std::string why_not_writable(const std::string& path);

// `path` with its folder resolved through links and relative parts (the file itself need not
// exist; an existing one is resolved through links too), to tell whether two paths name one file.
// A path whose folder does not exist comes back as given.
std::string resolved_path(const std::string& path);

// A file a command reads or writes, as its messages name it: `name` is the whole phrase
// ("--save out.safetensors", "--data", "save_state('x.st'): 'x.st'", "data='text:d.txt'").
struct NamedFile {
  std::string name;
  std::string path;  // empty: nothing to check
};
// Throws regen::Error when an output is the same file as an input or as an earlier output
// (through symbolic and hard links and relative paths): "<output's name> is the same file as
// <the other's name>: give each output its own path, never an input's". Writing it would replace
// what is read, or what another output holds. Checks nothing else (why_not_writable does).
void check_distinct_files(const std::vector<NamedFile>& outputs,
                          const std::vector<NamedFile>& inputs);

}  // namespace regen
