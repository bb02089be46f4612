/* libsluice: SL_API, the one mark of an exported function.
 *
 * libsluice.so is built with hidden visibility and links its internal pieces (the RPC layer, the
 * generated protobuf-c code) with their symbols hidden, so the functions declared with SL_API in
 * the installed headers are the whole of its ABI. Every other header of libsluice includes this
 * one; a program never needs to include it by itself.
 */
#ifndef SLUICE_EXPORT_H
#define SLUICE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define SL_API __attribute__((visibility("default")))
#else
#define SL_API
#endif

#endif
