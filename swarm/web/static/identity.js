// The tab's own Ed25519 identity: a WebCrypto key pair kept in IndexedDB (the private key
// is not extractable), and its PeerId as identity/keys.py derives it: the raw public key,
// printed "p" + lowercase base32 without padding.

const DB = "swarm", STORE = "keys", ID = "tab";

function idb() {
  return new Promise((resolve, reject) => {
    const req = indexedDB.open(DB, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(STORE);
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

function tx(db, mode, fn) {
  return new Promise((resolve, reject) => {
    const t = db.transaction(STORE, mode);
    const req = fn(t.objectStore(STORE));
    t.oncomplete = () => resolve(req.result);
    t.onerror = () => reject(t.error);
  });
}

export async function loadIdentity() {
  const db = await idb();
  let pair = await tx(db, "readonly", (s) => s.get(ID));
  if (!pair) {
    pair = await crypto.subtle.generateKey({ name: "Ed25519" }, false, ["sign", "verify"]);
    await tx(db, "readwrite", (s) => s.put(pair, ID));
  }
  const raw = new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey));
  return {
    raw, hex: toHex(raw), peerId: peerIdText(raw),
    sign: async (data) => new Uint8Array(await crypto.subtle.sign("Ed25519", pair.privateKey, data)),
  };
}

export async function verifier(rawPublic) {
  const key = await crypto.subtle.importKey("raw", rawPublic, { name: "Ed25519" }, false, ["verify"]);
  return (sig, data) => crypto.subtle.verify("Ed25519", key, sig, data);
}

export function toHex(b) { return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join(""); }
export function fromHex(h) { return Uint8Array.from(h.match(/../g), (x) => parseInt(x, 16)); }

const B32 = "abcdefghijklmnopqrstuvwxyz234567";
export function peerIdText(raw) {
  let bits = 0, value = 0, out = "p";
  for (const byte of raw) {
    value = (value << 8) | byte; bits += 8;
    while (bits >= 5) { out += B32[(value >>> (bits - 5)) & 31]; bits -= 5; }
  }
  if (bits > 0) out += B32[(value << (5 - bits)) & 31];
  return out;
}
