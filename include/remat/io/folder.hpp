#pragma once
/// @file
/// Saving a folder as a whole (a Hugging Face model folder, PEFT adapters): the files are written
/// into a new folder beside the target, flushed, and the new folder then takes the target's
/// place in one step (renameat2 with RENAME_EXCHANGE where the file system has it), so that
/// whoever reads the target sees either the old folder or the new one, complete, and never a
/// mix. A full disk, a failed write or a crash mid-save leaves the old folder as it was; what a
/// killed save left beside it is removed by the next save to the same target.
///
/// The old folder's other files (a tokenizer, a README) are carried over into the new one, except
/// weight files (*.safetensors, *.safetensors.index.json), which the new save replaces: a model
/// saved as one file over one saved in shards must not keep the old shards beside it.

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "remat/core/error.hpp"
#include "remat/io/posix_file.hpp"
#include "remat/io/safetensors.hpp"

namespace remat::io {
namespace detail {

/// Whether the old folder's file `name` is replaced by a new save rather than carried over.
inline bool is_weight_file(std::string_view name) {
  const auto ends_with = [&](std::string_view tail) {
    return name.size() >= tail.size() && name.substr(name.size() - tail.size()) == tail;
  };
  return ends_with(".safetensors") || ends_with(".safetensors.index.json");
}

/// Copies the entries of `from` that `to` does not have and that are not weight files into `to`:
/// files as hard links (no bytes copied; a file system without them gets a copy), folders
/// recursively.
inline void carry_over(const std::filesystem::path& from, const std::filesystem::path& to) {
  namespace fs = std::filesystem;
  for (const auto& entry : fs::directory_iterator(from)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file(name) || fs::exists(fs::symlink_status(to / name))) continue;
    std::error_code ec;
    if (entry.is_regular_file() && !entry.is_symlink()) {
      fs::create_hard_link(entry.path(), to / name, ec);
      if (!ec) continue;
    }
    fs::copy(entry.path(), to / name,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
}

/// Flushes the folder `dir` (its entries) to disk.
inline void sync_folder(const std::string& dir, const std::string& saving) {
  Descriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::fsync(fd.get()) != 0)
    throw system_error(remat::detail::cat("saving ", saving, ": flushing"), dir, errno);
}

}  // namespace detail

/// Writes `text` to `path` atomically (as save() writes a safetensors file).
inline void save_text(const std::string& path, const std::string& text) {
  const std::pair<const void*, std::size_t> chunk{text.data(), text.size()};
  detail::write_atomically(path, std::span(&chunk, 1));
}

/// Saves the folder `dir` as a whole (see the file comment): `fill(staging)` writes the files
/// into `staging`, a new folder beside `dir`; then `staging` replaces `dir`. Every failure
/// (`fill`'s exceptions included) leaves `dir` as it was and removes `staging`. Missing parent
/// folders are created. A symbolic link
/// to a folder is saved through (the link stays). Errors are IoErrors naming the folder.
template <class Fill>
void save_folder(const std::string& dir, Fill&& fill) {
  namespace fs = std::filesystem;
  if (dir.empty()) throw IoError("io::save_folder: empty folder name");
  std::error_code ec;
  fs::path target = fs::path(dir).lexically_normal();
  if (target.has_filename() == false) target = target.parent_path();  // "out/" is "out"
  if (fs::is_symlink(fs::symlink_status(target, ec))) {
    target = fs::canonical(target, ec);
    if (ec) throw IoError(remat::detail::cat("io::save_folder: ", dir, ": ", ec.message()));
  }
  ec.clear();
  const bool exists = fs::exists(target, ec);
  if (exists && !fs::is_directory(target, ec))
    throw detail::system_error("saving the folder", dir, ENOTDIR);
  const std::string parent = target.has_parent_path() ? target.parent_path().string() : ".";
  const std::string base = target.filename().string();
  fs::create_directories(parent, ec);  // as a file save, the folder's own parents are made
  detail::remove_stale_temporaries(parent, base);
  const std::string staging =
      detail::temporary_name(target.has_parent_path() ? parent + "/" : std::string(), base);
  if (::mkdir(staging.c_str(), 0777) != 0)
    throw detail::system_error(remat::detail::cat("saving ", dir, ": creating"), staging, errno);
  try {
    fill(staging);
    if (exists) {
      struct stat st {};
      if (::stat(target.c_str(), &st) == 0) ::chmod(staging.c_str(), st.st_mode & 07777);
      try {
        detail::carry_over(target, staging);
      } catch (const fs::filesystem_error& e) {
        throw IoError(remat::detail::cat("io::save_folder: saving ", dir,
                                         ": carrying over the old folder's files: ", e.what()));
      }
    }
    detail::sync_folder(staging, dir);
    if (!exists) {
      if (::rename(staging.c_str(), target.c_str()) != 0)
        throw detail::system_error(remat::detail::cat("renaming ", staging, " to"), dir, errno);
    } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) !=
               0) {
      // No exchange on this file system (EINVAL): the old folder steps aside under a temporary
      // name first, so the target is missing for the time of one rename.
      if (errno != EINVAL && errno != ENOSYS)
        throw detail::system_error(remat::detail::cat("swapping ", staging, " with"), dir, errno);
      const std::string aside =
          detail::temporary_name(target.has_parent_path() ? parent + "/" : std::string(), base);
      if (::rename(target.c_str(), aside.c_str()) != 0)
        throw detail::system_error("moving aside", dir, errno);
      if (::rename(staging.c_str(), target.c_str()) != 0) {
        const int err = errno;
        ::rename(aside.c_str(), target.c_str());  // put the old folder back
        throw detail::system_error(remat::detail::cat("renaming ", staging, " to"), dir, err);
      }
      fs::remove_all(aside, ec);
    }
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  fs::remove_all(staging, ec);  // after an exchange: the old folder
  detail::sync_folder(parent, dir);
}

}  // namespace remat::io
