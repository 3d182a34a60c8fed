/** The firmware catalog (docs/api.md, "GET /0/firmware/"): the images the operator added, and what they update. */
import { useEffect, useState } from 'preact/hooks';
import { call, explain } from '../api.js';
import type { Image } from './device/catalog.js';

export function Firmware() {
  const [images, setImages] = useState<Image[] | undefined>();
  const [error, setError] = useState<string | undefined>();
  useEffect(() => {
    let gone = false;
    void call('GET', '/0/firmware/').then((a) => {
      if (gone) return;
      if (a.status === 200) setImages(JSON.parse(a.text) as Image[]);
      else setError(explain(a));
    });
    return () => {
      gone = true;
    };
  }, []);
  return (
    <main>
      <h1>Firmware</h1>
      <p class="note">
        The images of this bridge's catalog. Start an update from a device's page; an image updates the devices of the
        platforms it lists.
      </p>
      {error && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      {images === undefined && !error && (
        <p class="note" role="status">
          Loading…
        </p>
      )}
      {images?.length === 0 && <p>The catalog is empty. The operator adds images with devcloud-bridge firmware add.</p>}
      {images && images.length > 0 && (
        <div class="table-wrap">
          <table class="list" data-testid="firmware-catalog">
            <caption class="sr-only">Firmware images</caption>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Version</th>
                <th scope="col">Built for</th>
                <th scope="col">Updates devices of</th>
              </tr>
            </thead>
            <tbody>
              {images.map((i) => (
                <tr key={`${i.name}@${i.version}`}>
                  <th scope="row" class="dv-value">
                    {i.name}
                  </th>
                  <td>{i.version}</td>
                  <td>{i.platform}</td>
                  <td>{i.info.platforms.from.join(', ')}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </main>
  );
}
