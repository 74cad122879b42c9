#pragma once
/// @file
/// The POSIX file operations remat's readers and writers share: descriptors closed exactly once,
/// regular files opened without blocking on a FIFO, and atomic writes (a temporary file in the
/// target's directory, flushed, renamed over the target, the directory flushed; what a killed
/// writer left behind is removed by the next). The formats (io/safetensors.hpp, io/json.hpp,
/// io/folder.hpp) are above it.

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "remat/core/error.hpp"

namespace remat::io::detail {

/// An IoError for a failed system call: what was being done, the file, and strerror(err).
inline IoError system_error(std::string_view doing, const std::string& path, int err) {
  return IoError(
      remat::detail::cat("safetensors: ", doing, " ", path, " failed: ", std::strerror(err)));
}

/// Owns a file descriptor and closes it exactly once: by close(), which reports the error, or
/// by the destructor on an error path. Linux releases the descriptor even when close() fails, so
/// it is never retried.
class Descriptor {
 public:
  explicit Descriptor(int fd) noexcept : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  /// Closes now; returns 0, or the errno of a failed close.
  int close() noexcept {
    if (fd_ < 0) return 0;
    const int r = ::close(fd_);
    fd_ = -1;
    return r == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

/// Writes `bytes` to `fd` entirely or throws.
inline void write_all(int fd, const void* data, std::size_t bytes, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw system_error("writing", path, errno);
    if (n == 0) throw system_error("writing", path, EIO);
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

/// The file `path` names after following symbolic links, so that a save replaces the link's
/// target and keeps the link. A dangling link names the file it points to (which a save creates).
inline std::string resolve_links(const std::string& path) {
  std::string at = path;
  for (int hop = 0; hop < 40; ++hop) {  // Linux's own limit (MAXSYMLINKS)
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at;
    std::vector<char> target(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : PATH_MAX) + 1);
    const ssize_t n = ::readlink(at.c_str(), target.data(), target.size());
    if (n < 0) throw system_error("following the link", at, errno);
    if (static_cast<std::size_t>(n) == target.size())
      throw system_error("following the link", at, ENAMETOOLONG);
    std::string next(target.data(), static_cast<std::size_t>(n));
    const auto slash = at.rfind('/');
    if (next.front() != '/' && slash != std::string::npos)
      next = at.substr(0, slash + 1) + next;  // relative to the link
    at = std::move(next);
  }
  throw system_error("following the links of", path, ELOOP);
}

/// The mode a newly created file gets (0666 less the umask), read without changing the umask,
/// which other threads may rely on at the same moment.
inline mode_t new_file_mode() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0)
      return 0666 & ~static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  }
  return 0644;  // no /proc: the usual umask 022
}

/// Flushes the directory `dir` so that a rename into it survives a crash.
inline void sync_directory(const std::string& dir, const std::string& path) {
  Descriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid())
    throw system_error(remat::detail::cat("saved ", path, " but opening its directory"), dir,
                       errno);
  if (::fsync(fd.get()) != 0)
    throw system_error(remat::detail::cat("saved ", path, " but flushing its directory"), dir,
                       errno);
  if (const int err = fd.close())
    throw system_error(remat::detail::cat("saved ", path, " but closing its directory"), dir, err);
}

/// Whether process `pid` runs on this machine (EPERM: it does, as another user).
inline bool process_alive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

/// The start of the names of the temporaries saves to `base` make in its directory:
/// "." + base (cut so that a name stays within NAME_MAX) + ".tmp.", then the saving process'
/// id, "." and a number unique within that process.
inline std::string temporary_prefix(const std::string& base) {
  // cat, not "." + std::string: GCC 12's -O3 warning (checkpoint/derive_policies.hpp)
  return remat::detail::cat(".", std::string_view(base).substr(0, 200), ".tmp.");
}

/// A new temporary name in `dir` (with its slash, or "") for a save to `base`.
inline std::string temporary_name(const std::string& dir, const std::string& base) {
  static std::atomic<unsigned long long> counter{0};
  return remat::detail::cat(dir, temporary_prefix(base), static_cast<long>(::getpid()), ".",
                            counter.fetch_add(1));
}

/// Removes what earlier saves to `base` left in `dir` when their process died mid-save (killed,
/// power cut): the entries named temporary_prefix(base) + PID + "." + anything whose process
/// PID no longer runs, files or folders. A running process' temporaries (a concurrent save) are
/// left alone. Best effort: what cannot be removed stays, and the save goes on.
inline void remove_stale_temporaries(const std::string& dir, const std::string& base) {
  const std::string prefix = temporary_prefix(base);
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir.empty() ? "." : dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::size_t digits = name.find_first_not_of("0123456789", prefix.size());
    if (digits == prefix.size() || digits == std::string::npos || name[digits] != '.' ||
        digits - prefix.size() > 9)
      continue;
    if (process_alive(std::stol(name.substr(prefix.size(), digits - prefix.size())))) continue;
    std::error_code ignored;
    std::filesystem::remove_all(it->path(), ignored);
  }
}

/// Writes `chunks` to `path` atomically (see the file comment): a temporary next to the target,
/// fsync, rename, fsync of the directory; the temporary is removed on every failure. Where the
/// file system can, the temporary is written without a name (O_TMPFILE) and named only just
/// before the rename, so that a process killed while writing leaves nothing behind; what a
/// killed save left under a name is removed by the next save to the same target.
inline void write_atomically(const std::string& path,
                             std::span<const std::pair<const void*, std::size_t>> chunks) {
  const std::string target = resolve_links(path);
  const auto slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : target.substr(0, slash);
  const std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  const std::string dir_prefix =
      slash == std::string::npos ? std::string() : target.substr(0, slash + 1);
  mode_t mode = 0;
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw system_error("saving", path, EISDIR);
    mode = st.st_mode & 07777;  // an existing file keeps its permissions
  } else if (errno == ENOENT) {
    mode = new_file_mode();
  } else {
    throw system_error("saving", path, errno);
  }
  remove_stale_temporaries(dir, base);
  // In the same directory (a rename cannot cross file systems). The anonymous file gets its name
  // through /proc/self/fd, so it is used only where that exists.
  const bool anonymous = ::access("/proc/self/fd", X_OK) == 0;
  std::string temporary = anonymous ? std::string() : temporary_name(dir_prefix, base);
  int raw = anonymous ? ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600) : -1;
  if (raw < 0) {  // no O_TMPFILE on this file system (EOPNOTSUPP): a named temporary
    if (temporary.empty()) temporary = temporary_name(dir_prefix, base);
    raw = ::open(temporary.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  }
  Descriptor fd(raw);
  if (!fd.valid())
    throw system_error(remat::detail::cat("saving ", path, ": creating a temporary file in"), dir,
                       errno);
  try {
    if (::fchmod(fd.get(), mode) != 0)
      throw system_error("setting the permissions of", temporary.empty() ? path : temporary, errno);
    for (const auto& [data, bytes] : chunks)
      write_all(fd.get(), data, bytes, temporary.empty() ? path : temporary);
    if (::fsync(fd.get()) != 0)
      throw system_error("flushing", temporary.empty() ? path : temporary, errno);
    if (temporary.empty()) {  // name the anonymous file, to rename it over the target
      temporary = temporary_name(dir_prefix, base);
      const std::string self = remat::detail::cat("/proc/self/fd/", fd.get());
      if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, temporary.c_str(), AT_SYMLINK_FOLLOW) != 0) {
        const int err = errno;
        temporary.clear();  // nothing to remove
        throw system_error("naming the temporary file of", path, err);
      }
    }
    if (const int err = fd.close()) throw system_error("closing", temporary, err);
    if (::rename(temporary.c_str(), target.c_str()) != 0) {
      throw system_error(remat::detail::cat("renaming ", temporary, " to"), target, errno);
    }
  } catch (...) {
    fd.close();
    if (!temporary.empty()) ::unlink(temporary.c_str());
    throw;
  }
  sync_directory(dir, path);
}

/// What a file is, for a message about one that is not a regular file.
inline const char* file_kind(mode_t mode) noexcept {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// Opens `path` for reading if it is a regular file (a symbolic link to one included), and
/// returns the descriptor and the file's size. Anything else is an IoError naming the file and
/// what it is (`who` starts the message), a directory with strerror(EISDIR). The open is
/// non-blocking: opening a FIFO for reading would wait for a writer forever, and the file's
/// type is only known for certain from the descriptor (a stat() before the open could see
/// another file than the one opened).
inline std::pair<Descriptor, std::size_t> open_regular(const std::string& path,
                                                       std::string_view who) {
  Descriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  const auto fail = [&](std::string_view doing, int err) {
    return IoError(
        remat::detail::cat(who, ": ", doing, " ", path, " failed: ", std::strerror(err)));
  };
  if (!fd.valid()) throw fail("opening", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw fail("reading", errno);
  if (S_ISDIR(st.st_mode)) throw fail("reading", EISDIR);
  if (!S_ISREG(st.st_mode)) {
    throw IoError(remat::detail::cat(who, ": cannot read ", path, ": ", file_kind(st.st_mode),
                                     ", not a regular file"));
  }
  // back to blocking reads (a regular file ignores the flag; this keeps reads plain)
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    throw fail("reading", errno);
  return {std::move(fd), static_cast<std::size_t>(st.st_size)};
}

}  // namespace remat::io::detail
