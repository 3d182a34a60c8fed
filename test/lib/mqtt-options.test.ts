/**
 * The one builder of MQTT client options (lib/mqtt-options.ts): what it sets for each input, the options each of
 * its callers gets (the agent's uplink and enrolment request, doctor's check, the bridge's link and its dynamic
 * security connection), and the errors of a TLS file that cannot be read.
 */
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { type MqttClientSpec, MqttTlsFileError, mqttClientOptions, readMqttTls } from '../../lib/mqtt-options.js';
import { tempDir } from '../support/agent.js';

const BASE: MqttClientSpec = {
  clientId: 'c1',
  clean: true,
  keepaliveSec: 45,
  connectTimeoutMs: 7000,
  reconnectPeriodMs: 0,
  lean: false,
};

describe('mqttClientOptions', () => {
  it('sets what every client states, and nothing it leaves out', () => {
    expect(mqttClientOptions(BASE)).toStrictEqual({
      clientId: 'c1',
      clean: true,
      keepalive: 45,
      connectTimeout: 7000,
      reconnectPeriod: 0,
    });
  });

  it('passes the session, keepalive, timeout and reconnect period as given', () => {
    const o = mqttClientOptions({ ...BASE, clean: false, keepaliveSec: 1, connectTimeoutMs: 1, reconnectPeriodMs: 1 });
    expect(o).toMatchObject({ clean: false, keepalive: 1, connectTimeout: 1, reconnectPeriod: 1 });
  });

  it('sets credentials only when given; an empty password is a password', () => {
    expect(mqttClientOptions({ ...BASE, username: 'u', password: 'p' })).toMatchObject({
      username: 'u',
      password: 'p',
    });
    const none = mqttClientOptions({ ...BASE, username: undefined, password: undefined });
    expect(Object.keys(none)).not.toContain('username');
    expect(Object.keys(none)).not.toContain('password');
    expect(mqttClientOptions({ ...BASE, username: 'u', password: '' })).toMatchObject({ password: '' });
  });

  it('lean turns off the QoS 0 queue and the write cache; otherwise mqtt.js keeps its defaults', () => {
    expect(mqttClientOptions({ ...BASE, lean: true })).toMatchObject({ queueQoSZero: false, writeCache: false });
    const full = mqttClientOptions(BASE);
    expect('queueQoSZero' in full || 'writeCache' in full).toBe(false);
  });

  it('sets resubscribe, the last will and rejectUnauthorized only when given', () => {
    const will = { topic: 't', payload: Buffer.from('offline'), qos: 0 as const, retain: true };
    expect(mqttClientOptions({ ...BASE, resubscribe: true, will, rejectUnauthorized: false })).toMatchObject({
      resubscribe: true,
      will,
      rejectUnauthorized: false,
    });
    expect(mqttClientOptions({ ...BASE, rejectUnauthorized: true })).toMatchObject({ rejectUnauthorized: true });
    const plain = mqttClientOptions({
      ...BASE,
      resubscribe: undefined,
      will: undefined,
      rejectUnauthorized: undefined,
    });
    for (const key of ['resubscribe', 'will', 'rejectUnauthorized']) expect(Object.keys(plain)).not.toContain(key);
  });

  it('sets the TLS material that is there', () => {
    const ca = Buffer.from('ca');
    const cert = Buffer.from('cert');
    const key = Buffer.from('key');
    expect(mqttClientOptions({ ...BASE, tls: { ca, cert, key } })).toMatchObject({ ca, cert, key });
    const caOnly = mqttClientOptions({ ...BASE, tls: { ca, cert: undefined } });
    expect(caOnly.ca).toBe(ca);
    expect('cert' in caOnly || 'key' in caOnly).toBe(false);
    expect(Object.keys(mqttClientOptions({ ...BASE, tls: {} }))).toEqual(Object.keys(mqttClientOptions(BASE)));
  });

  describe('the options of each client', () => {
    const ca = Buffer.from('ca');
    const will = { topic: 'dc/v1/x/state', payload: Buffer.from('offline'), qos: 0 as const, retain: true };

    it("the agent's uplink: clean, its own keepalive and timeout, no reconnects of mqtt.js, a last will", () => {
      const o = mqttClientOptions({
        clientId: 'dev',
        username: 'dev',
        password: 'secret',
        clean: true,
        keepaliveSec: 30,
        connectTimeoutMs: 10_000,
        reconnectPeriodMs: 0,
        lean: true,
        will,
        tls: { ca },
        rejectUnauthorized: true,
      });
      expect(o).toStrictEqual({
        clientId: 'dev',
        username: 'dev',
        password: 'secret',
        clean: true,
        keepalive: 30,
        connectTimeout: 10_000,
        reconnectPeriod: 0,
        queueQoSZero: false,
        writeCache: false,
        will,
        ca,
        rejectUnauthorized: true,
      });
    });

    it("the bridge's link: a persistent session, reconnects every second, subscribes again", () => {
      const o = mqttClientOptions({
        clientId: 'devcloud-bridge',
        username: 'bridge',
        password: 'pw',
        clean: false,
        keepaliveSec: 30,
        connectTimeoutMs: 10_000,
        reconnectPeriodMs: 1000,
        resubscribe: true,
        lean: true,
        tls: { ca },
      });
      expect(o).toStrictEqual({
        clientId: 'devcloud-bridge',
        username: 'bridge',
        password: 'pw',
        clean: false,
        keepalive: 30,
        connectTimeout: 10_000,
        reconnectPeriod: 1000,
        resubscribe: true,
        queueQoSZero: false,
        writeCache: false,
        ca,
      });
    });

    it("the bridge's link in a share group: MQTT 5, and a persistent session that expires", () => {
      const o = mqttClientOptions({
        clientId: 'bridge-1',
        clean: false,
        protocolVersion: 5,
        sessionExpirySec: 60,
        keepaliveSec: 30,
        connectTimeoutMs: 10_000,
        reconnectPeriodMs: 1000,
        resubscribe: true,
        lean: true,
      });
      expect(o).toStrictEqual({
        clientId: 'bridge-1',
        clean: false,
        protocolVersion: 5,
        properties: { sessionExpiryInterval: 60 },
        keepalive: 30,
        connectTimeout: 10_000,
        reconnectPeriod: 1000,
        resubscribe: true,
        queueQoSZero: false,
        writeCache: false,
      });
      // MQTT 3.1.1 has no session expiry: asking for one there is a mistake of the caller.
      expect(() => mqttClientOptions({ ...BASE, sessionExpirySec: 60 })).toThrow(/MQTT 5/);
      expect(mqttClientOptions({ ...BASE, protocolVersion: undefined, sessionExpirySec: undefined })).toStrictEqual(
        mqttClientOptions(BASE),
      );
    });

    it("dynamic security: clean, mqtt.js's queue and cache, no TLS check setting of its own", () => {
      const o = mqttClientOptions({
        clientId: 'devcloud-bridge-dynsec',
        username: 'bridge',
        password: 'pw',
        clean: true,
        keepaliveSec: 30,
        connectTimeoutMs: 10_000,
        reconnectPeriodMs: 1000,
        lean: false,
        tls: { ca: undefined },
      });
      expect(o).toStrictEqual({
        clientId: 'devcloud-bridge-dynsec',
        username: 'bridge',
        password: 'pw',
        clean: true,
        keepalive: 30,
        connectTimeout: 10_000,
        reconnectPeriod: 1000,
      });
    });
  });
});

describe('readMqttTls', () => {
  const dir = tempDir('devcloud-mqtt-options-');
  const pem = (name: string, text: string): string => {
    const file = join(dir, name);
    writeFileSync(file, text);
    return file;
  };

  it('reads the files that are named, and no other', () => {
    const caFile = pem('ca.pem', 'the CA');
    const certFile = pem('cert.pem', 'the cert');
    const keyFile = pem('key.pem', 'the key');
    const all = readMqttTls({ caFile, certFile, keyFile });
    expect([all.ca?.toString(), all.cert?.toString(), all.key?.toString()]).toEqual(['the CA', 'the cert', 'the key']);
    expect(readMqttTls({ caFile })).toStrictEqual({ ca: Buffer.from('the CA') });
    expect(readMqttTls({})).toStrictEqual({});
    // An empty name is no file, as the agent has always read it.
    expect(readMqttTls({ caFile: '', certFile: undefined })).toStrictEqual({});
  });

  it('reads again at every call: a rotated certificate is picked up by the next connection', () => {
    const caFile = pem('rotated.pem', 'old');
    expect(readMqttTls({ caFile }).ca?.toString()).toBe('old');
    writeFileSync(caFile, 'new');
    expect(readMqttTls({ caFile }).ca?.toString()).toBe('new');
  });

  it.each([
    ['caFile', 'CA'],
    ['certFile', 'client certificate'],
    ['keyFile', 'client key'],
  ] as const)('a %s that is missing: an error that names it, its path and the reason', (key, what) => {
    const file = join(dir, `missing-${key}.pem`);
    let err: unknown;
    try {
      readMqttTls({ [key]: file });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(MqttTlsFileError);
    const e = err as MqttTlsFileError;
    // The bridge has always refused to start with this message; the agent logs it as `mqtt.config_error`.
    expect(e.message).toBe(`cannot read the MQTT ${what} file: ENOENT: no such file or directory, open '${file}'`);
    // What doctor says: `cannot read mqtt.caFile <file> (ENOENT)`.
    expect([e.key, e.file, e.code]).toEqual([key, file, 'ENOENT']);
  });

  it('stops at the first file that cannot be read, in the order CA, certificate, key', () => {
    const caFile = pem('good-ca.pem', 'ok');
    const folder = join(dir, 'a-folder');
    mkdirSync(folder, { recursive: true });
    expect(() => readMqttTls({ caFile, certFile: folder, keyFile: join(dir, 'nope') })).toThrow(
      expect.objectContaining({ key: 'certFile', file: folder, code: 'EISDIR' }),
    );
  });

  it('a path it cannot read as a file: the code of the error, whoever runs it', () => {
    // A folder where the key should be: unreadable as a file even for root, unlike a file without permissions.
    const keyFile = join(tempDir('devcloud-key-dir-'), 'key.pem');
    mkdirSync(keyFile);
    try {
      expect(() => readMqttTls({ keyFile })).toThrow(
        expect.objectContaining({
          key: 'keyFile',
          code: 'EISDIR',
          message: expect.stringMatching(/^cannot read the MQTT client key file: EISDIR/),
        }),
      );
    } finally {
      rmSync(dirname(keyFile), { recursive: true, force: true });
    }
  });
});
