// OS thread names (thread_name.hpp).
#include "util/thread_name.hpp"

#include <pthread.h>

namespace mirrored::detail {

void set_os_thread_name(std::thread& thread, const std::string& name) noexcept {
  pthread_setname_np(thread.native_handle(), name.substr(0, 15).c_str());
}

}  // namespace mirrored::detail
